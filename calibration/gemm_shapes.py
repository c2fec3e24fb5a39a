"""GEMM shapes at few rows: how far Linear layers of different shapes differ in speed
at one row count, and what that leaves of a cost model that prices a GEMM by its work.

    python -m bench.gemm_shapes                                  # default shapes, 8-64 rows
    python -m bench.gemm_shapes --shapes 1024x1024 512x1024 1024x512 --rounds 3
    python -m bench.gemm_shapes --profile hardware_profiles/measured/lab/amd_cold.json
    python -m bench.gemm_shapes --load results/gemm_shapes/shapes.json --json

Every shape ``IxO`` is an ``nn.Linear(I, O)`` timed forward and backward (its input
requires grad, as inside a network) at 8, 16, 32 and 64 rows, exactly as ``hetsim
profile`` times its single-layer benchmarks
(:func:`calibration.profiler.measure_micro`, benchmarks ``linear_IxO_rows``:
the profile's repeats, ``--rounds`` interleaved rounds, one thread). The
measurements are saved (``--out``) before anything is reported; ``--load``
reports saved ones again.

At one row count the shapes' passes have nearly one intensity (FLOPs per byte
moved: about rows / 2 in both phases once the weights dominate the bytes; the
backward does twice the FLOPs and moves the weights twice), so a cost model whose
GEMM efficiency is a function of intensity (or of FLOPs within a narrow band)
gives them nearly one rate. Per row count and phase
the report gives:

* the achieved rate (GFLOP/s = FLOPs / own time) over the shapes: min, median,
  max, and max / min;
* ``one-rate floor``: the least median |error| any single rate can have over the
  shapes (:func:`one_rate_floor`), and the half range (max - min) / (max + min),
  the least worst-case error: what a cost model that prices these shapes alike
  must miss by, however well it is fitted;
* with ``--profile P``: P's cost model (its curves fitted to all of P's raw
  measurements, without per-layer tables, as the leave-one-model-out bench uses
  it) pricing each shape, its median and worst |error|, and ``floor after
  scale``: the one-rate floor of its pred / meas ratios, what is left when the
  machine's drift since P was measured (one factor for every shape) is taken
  out.

Then a table of every shape's rate per row count. Not a test: the figures depend
on the machine, its BLAS and its neighbours.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibration.profiler import measure_micro, setup_host, spec_for
from calibration.profiler.timing import _Progress
from calibration.saved_runs import (
    add_run_options,
    check_run,
    half_range,
    own_times,
    pct,
    save_run,
    start_run,
)
from hardware_profiles.errors import ConfigError
from sim.costmodel import layer_work
from sim.workload import model_from_dict

#: Linear shapes (in x out) measured by default: squares from 256 to 1024, mlp's first
#: layer (784 x 1024), and pairs of one weight size in both orientations.
DEFAULT_SHAPES = ("256x256", "512x512", "768x768", "784x1024", "1024x1024", "256x1024",
                  "1024x256", "512x1024", "1024x512", "1024x2048", "2048x1024", "512x4096",
                  "4096x512", "4096x1024")
DEFAULT_OUT = "results/gemm_shapes/shapes.json"
PHASES = ("fwd", "bwd")
#: Candidate rates of :func:`one_rate_floor`, spaced evenly in log between the least and
#: the greatest (a step of 0.05% for a max/min of 2.7).
FLOOR_GRID = 2001


def parse_shapes(items: Sequence[str]) -> list[str]:
    """``["1024x1024", "784x1024"]`` checked: each ``IxO`` with positive integers.

    Raises:
        ConfigError: ``<command line>: --shapes: ...``.
    """
    out: list[str] = []
    for item in items:
        parts = item.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError("<command line>", "--shapes",
                              f"{item!r}: give IN x OUT as two positive integers, e.g. 1024x1024")
        if item not in out:
            out.append(item)
    return out


def measure(shapes: Sequence[str], rounds: int, threads: int, progress: bool = True
            ) -> list[dict[str, Any]]:
    """``raw["micro"]`` entries (:func:`calibration.profiler.measure_micro`) of
    ``linear_{shape}_rows`` for each of ``shapes`` on the CPU, with a full profile's
    repeats in ``rounds`` rounds."""
    dev, _ = setup_host("cpu", threads)
    names = [f"linear_{s}_rows" for s in shapes]
    bar = _Progress(len(names) * rounds, progress)
    try:
        return measure_micro(names, dev, spec_for(False), bar=bar, rounds=rounds)
    finally:
        bar.close()


def _work_layer(entry: dict[str, Any]) -> tuple[Any, int]:
    """(the entry's one-layer model, the index of its Linear: a GEMM with FLOPs).

    Raises:
        ConfigError: from :func:`sim.workload.model_from_dict`.
        StopIteration: the model has no such layer.
    """
    model = model_from_dict(entry["model"], source=f"micro:{entry['name']}")
    return model, next(i for i, ly in enumerate(model.layers)
                       if ly.op == "gemm" and ly.fwd_flops > 0)


def shape_rows(entries: Sequence[dict[str, Any]], profile: Any = None) -> list[dict[str, Any]]:
    """One row per shape, batch and phase: its weight and bias bytes, FLOPs, bytes moved,
    intensity, own time (:func:`calibration.saved_runs.own_times`) and rate (FLOPs / time; 0
    without a time), and with ``profile`` (a fitted profile without tables) the cost
    model's time for it (``pred_s``)."""
    from calibration.calibrate import predict_layers

    out = []
    for e in entries:
        model, i = _work_layer(e)
        ly = model.layers[i]
        shape = e["name"].removeprefix("linear_").removesuffix("_rows")
        for run in e["runs"]:
            b = int(run["batch"])
            own = own_times(run, ly.name)
            pred = predict_layers(profile, model, b, glue=False) if profile is not None else None
            for side, phase in enumerate(PHASES):
                flops, _, nbytes = layer_work(ly, phase, b, "fp32", model.input_bytes_of(i))
                t = float(own[side])
                row = {"shape": shape, "batch": b, "phase": phase, "param_bytes": ly.param_bytes,
                       "flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "t_s": t,
                       "rate": flops / t if t > 0 else 0.0}
                if pred is not None:
                    row["pred_s"] = float(pred[side][i])
                out.append(row)
    return out


def one_rate_floor(xs: Sequence[float]) -> tuple[float, float]:
    """(v, the median over ``xs`` of |x / v - 1|) for the ``v`` that makes that median
    least, searched over FLOOR_GRID values evenly spaced in log between min and max
    (the least one on ties): the least median relative error of one value priced
    against every x. Pricing work of rate x at rate v errs by x / v - 1 in time."""
    a = np.asarray(xs, dtype=float)
    if len(a) == 0 or np.any(a <= 0):
        raise ValueError("need positive values")
    lo, hi = float(a.min()), float(a.max())
    cands = np.geomspace(lo, hi, FLOOR_GRID) if hi > lo else np.array([lo])
    med = np.median(np.abs(a[None, :] / cands[:, None] - 1.0), axis=1)
    j = int(np.argmin(med))
    return float(cands[j]), float(med[j])


def groups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch and phase, over the shapes: rates, their one-rate floor and half range,
    and where the rows have ``pred_s`` the cost model's errors and the floor of its
    pred / meas ratios."""
    keyed: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["rate"] > 0:  # a pass with a time
            keyed.setdefault((r["batch"], r["phase"]), []).append(r)
    out = []
    for (b, phase), rs in sorted(keyed.items(), key=lambda kv: (kv[0][0], PHASES.index(kv[0][1]))):
        rates = [r["rate"] for r in rs]
        g: dict[str, Any] = {
            "batch": b, "phase": phase, "shapes": len(rs),
            "intensity": [min(r["intensity"] for r in rs), max(r["intensity"] for r in rs)],
            "rate_min": min(rates), "rate_median": float(np.median(rates)), "rate_max": max(rates),
            "max_over_min": max(rates) / min(rates), "floor": one_rate_floor(rates)[1],
            "half_range": half_range(rates)}
        if all("pred_s" in r for r in rs):
            ratio = [r["pred_s"] / r["t_s"] for r in rs]
            errs = np.abs(np.asarray(ratio) - 1.0)
            g.update(pred_median=float(np.median(errs)), pred_worst=float(errs.max()),
                     pred_floor=one_rate_floor(ratio)[1])
        out.append(g)
    return out


def print_report(rows: Sequence[dict[str, Any]], gs: Sequence[dict[str, Any]],
                 meta: dict[str, Any], profile: str | None) -> None:
    shapes = {r["shape"]: r["param_bytes"] for r in rows}
    print(f"GEMM shapes at few rows: {len(shapes)} Linear shapes, {meta['rounds']} "
          f"round(s), {meta['threads']} thread(s); rates in GFLOP/s (FLOPs / own time)")
    head = (f"{'rows':>4} {'phase':>5} {'intensity':>11} {'min':>6} {'median':>6} {'max':>6} "
            f"{'max/min':>7} {'floor':>6} {'half rng':>8}")
    if profile:
        head += f" | {'pred med':>8} {'worst':>7} {'floor after scale':>17}"
    print(head)
    for g in gs:
        lo, hi = g["intensity"]
        line = (f"{g['batch']:>4} {g['phase']:>5} {lo:>5.1f}-{hi:<5.1f} {g['rate_min'] / 1e9:>6.1f} "
                f"{g['rate_median'] / 1e9:>6.1f} {g['rate_max'] / 1e9:>6.1f} "
                f"{g['max_over_min']:>7.2f} {pct(g['floor']):>6} {pct(g['half_range']):>8}")
        if "pred_median" in g:
            line += (f" | {pct(g['pred_median']):>8} {pct(g['pred_worst']):>7} "
                     f"{pct(g['pred_floor']):>17}")
        print(line)
    print("floor: the least median |error| of one rate over the shapes; half rng: the least "
          "worst-case error" + (f"; pred: {profile}'s cost model (curves, no tables)" if profile
                                else ""))
    batches = sorted({r["batch"] for r in rows})
    by = {(r["shape"], r["batch"], r["phase"]): r for r in rows}
    print("\nper shape, GFLOP/s forward / backward" + (" (pred / meas - 1 backward)" if profile else ""))
    print(f"{'shape':>10} {'MiB':>6} " + " ".join(f"{f'{b} rows':>16}" for b in batches))
    for shape, weights in shapes.items():
        cells = []
        for b in batches:
            f, k = by.get((shape, b, "fwd")), by.get((shape, b, "bwd"))
            cell = (f"{f['rate'] / 1e9:.1f}/{k['rate'] / 1e9:.1f}" if f and k else "-")
            if profile and k and "pred_s" in k and k["t_s"] > 0:
                cell += f" {100 * (k['pred_s'] / k['t_s'] - 1):+.0f}%"
            cells.append(f"{cell:>16}")
        print(f"{shape:>10} {weights / 2**20:>6.2f} " + " ".join(cells))


def _check_saved(saved: Any, path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The entries and meta of a saved run, each field checked (one-line errors)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("entries"), list) \
            or not isinstance(saved.get("meta"), dict):
        raise ConfigError(path, "", "not saved measurements of this bench (no entries and meta)")
    meta = saved["meta"]
    for key in ("shapes", "rounds", "threads"):
        if key not in meta:
            raise ConfigError(path, f"meta.{key}", "missing")
    if not isinstance(meta["shapes"], list) or not all(isinstance(x, str) for x in meta["shapes"]):
        raise ConfigError(path, "meta.shapes", "must be a list of IxO shapes")
    try:
        parse_shapes(meta["shapes"])
    except ConfigError as err:
        raise ConfigError(path, "meta.shapes", err.message) from None
    for n, e in enumerate(saved["entries"]):
        where = f"entries[{n}]"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) \
                or not isinstance(e.get("model"), dict) or not isinstance(e.get("runs"), list):
            raise ConfigError(path, where, "needs name, model and runs")
        for m, run in enumerate(e["runs"]):
            check_run(run, path, f"{where}.runs[{m}]")
        try:
            model, i = _work_layer(e)
        except ConfigError as err:
            raise ConfigError(path, f"{where}.model", f"{err.field}: {err.message}") from None
        except StopIteration:
            raise ConfigError(path, f"{where}.model", "has no GEMM layer with FLOPs") from None
        name = model.layers[i].name
        for m, run in enumerate(e["runs"]):
            if name not in run["layers"] and name not in (run.get("own") or {}):
                raise ConfigError(path, f"{where}.runs[{m}].layers.{name}",
                                  "needs [forward s, backward s, ...], each 0 or more")
    return saved["entries"], meta


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gemm_shapes",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), metavar="IxO",
                    help="Linear shapes, in x out (default: %(default)s)")
    add_run_options(ap, "the measurements", DEFAULT_OUT, rounds=3,
                    rounds_help="interleaved rounds, as `hetsim profile --rounds` (default 3)",
                    profile_help="a measured profile whose cost model prices every shape")
    a = ap.parse_args(argv)
    try:
        shapes = parse_shapes(a.shapes)
        prof, saved = start_run(a)
        if saved is not None:
            entries, meta = _check_saved(saved, a.load)
        else:
            entries = measure(shapes, a.rounds, a.threads, progress=not a.json)
            meta = {"shapes": shapes, "rounds": a.rounds, "threads": a.threads}
            save_run(a, meta, "entries", entries)
    except ConfigError as e:
        print(f"error: {e.line()}", file=sys.stderr)
        return 2
    fitted = None
    if prof is not None:
        from calibration.calibrate import fit

        try:
            fitted = fit(prof)[0]
        except ValueError as e:
            print(f"error: {a.profile}: measurement.raw: {e}", file=sys.stderr)
            return 2
    rows = shape_rows(entries, fitted)
    gs = groups(rows)
    if a.json:
        print(json.dumps({"meta": meta, "profile": a.profile, "groups": gs, "rows": rows}, indent=2))
    else:
        print_report(rows, gs, meta, a.profile)
    return 0
