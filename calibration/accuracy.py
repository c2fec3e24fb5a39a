"""Calibration accuracy: leave-one-model-out prediction of measured layer times.

    python -m bench.calibration_accuracy PROFILE [--repeat PROFILE2] [--json]
    python -m bench.calibration_accuracy PROFILE --passes MODEL   # its every pass
    python -m bench.calibration_accuracy PROFILE --plot results/calibration.png

(``--json``: the figures as JSON, every row with its passes.)

For each zoo model measured in PROFILE (``hetsim profile``), the efficiency
curves are fitted on every other model and the single-layer benchmarks
(:func:`calibration.calibrate.fit` with ``exclude=[model]``), and the
cost model, without per-layer tables, predicts the held-out model's
per-layer forward and backward times and its whole forward+backward
iteration at each measured batch size (two or more). Errors are relative to
the measured medians; the whole-iteration reference is the iteration timed
without hooks. Targets (issue 3, this project's CPU machine): median
|per-layer error| <= 15% and |whole-iteration error| <= 10% for every model.

The noise floor printed below the table (:func:`noise_floor`): the standard
error of each per-layer median (from the recorded IQR and repeat count) and
how far layers of one signature in one run differ from each other. Per row,
``twins``: the held-out model's passes whose very work another model or a
single-layer benchmark measured too, and how far they are from those twins'
median time (:func:`twin_floor`): what a cost model that sees a pass's work
alone misses on them even when it predicts each pass's twins' median exactly.

Where the profile has the drift probe's samples (``raw["drift"]``: the same GEMM
and copy timed after every step of the run), how far the machine's own speed
moved while it measured is printed too: a model measured while the machine ran
slow is predicted from models measured while it ran fast.

With ``--repeat`` a second profile of the same machine is compared with the
first: the relative difference of every per-layer time and every whole
iteration (repeatability), next to the spread each profile recorded, and per
row (the table's ``repeat`` column) how far that row's measurement moved between
the two profiles.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibration import model_variants
from calibration.calibrate import drift_of, fit, points_from_raw, predict_layers
from calibration.profiler import drift_line
from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import prepare_out

LAYER_TARGET = 0.15
ITER_TARGET = 0.10


def _passes(fitted: Any, model: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured pass of one run of ``model`` with the prediction of ``fitted``:
    a layer's own time where the profile has it, against the prediction without
    glue; else the time charged to it, against the prediction with the glue."""
    b = int(run["batch"])
    own = run.get("own") or {}
    pf, pb = predict_layers(fitted, model, b, glue=not own)
    out = []
    for i, ly in enumerate(model.layers):
        vals = run["layers"].get(ly.name)
        if vals is None:
            continue
        ref = own.get(ly.name, vals)
        for phase, pred, meas in (("fwd", pf[i], ref[0]), ("bwd", pb[i], ref[1])):
            if meas > 0:
                out.append({"layer": ly.name, "op": ly.op, "phase": phase, "pred_s": float(pred),
                            "meas_s": float(meas), "err": (float(pred) - meas) / meas})
    return out


def loo_rows(profile: Any, only: str | None = None) -> list[dict[str, Any]]:
    """One row per (held-out model, batch size); ``only``: that model alone.

    Each row keeps its passes (``passes``: layer, phase, predicted and measured
    seconds, relative error) and, where other sources measured the same work,
    the twin floor of :func:`twin_floor` (``twin_passes``, ``twin_median_abs_err``).
    """
    raw = profile.measurement.raw or {}
    by_pass = pass_twins(profile)
    twins = _twin_rows(by_pass)
    rows = []
    for name, runs in raw.get("models", {}).items():
        if only is not None and name != only:
            continue
        fitted, _ = fit(profile, exclude=[name])
        model = model_variants.model(name)
        for run in runs:
            b = int(run["batch"])
            row = run_errors(fitted, model, run)
            for p in row["passes"]:
                _t, n_tw, t_tw = by_pass.get((name, b, p["layer"], p["phase"]), (0.0, 0, None))
                p.update(twins=n_tw, twin_s=t_tw)
            measured_sum = sum(vals[0] + vals[1] for ly in model.layers
                               if (vals := run["layers"].get(ly.name)) is not None)
            tw = twins.get((name, b), {})
            passes = row.pop("passes")
            rows.append({
                "model": name, **row,
                "glue_frac": float(run.get("glue_s", run.get("unattributed_s", 0.0)))
                / float(run["hooked_iter_s"]),
                "layers_over_iter": measured_sum / float(run["iter_s"]),
                "layer_ref": "own" if run.get("own") else "charged",
                "twin_passes": tw.get("passes", 0),
                "twin_median_abs_err": tw.get("median_abs_err"),
                "passes": passes,
            })
    return rows


def run_errors(fitted: Any, model: Any, run: dict[str, Any]) -> dict[str, Any]:
    """How ``fitted`` (a profile priced by its curves) predicts one measured run of
    ``model`` (a ``raw["models"]`` entry): ``batch``, ``layer_passes``,
    ``layer_median_abs_err``, ``layer_p90_abs_err`` (over :func:`_passes`),
    ``iter_pred_s``, ``iter_meas_s`` (the iteration timed without hooks),
    ``iter_err`` and ``passes``."""
    b = int(run["batch"])
    passes = _passes(fitted, model, run)
    errs = [abs(p["err"]) for p in passes]
    pf, pb = predict_layers(fitted, model, b)
    whole_pred = float(sum(pf) + sum(pb))
    whole = float(run["iter_s"])
    return {"batch": b, "layer_passes": len(errs),
            "layer_median_abs_err": float(np.median(errs)) if errs else 0.0,
            "layer_p90_abs_err": float(np.percentile(errs, 90)) if errs else 0.0,
            "iter_pred_s": whole_pred, "iter_meas_s": whole,
            "iter_err": (whole_pred - whole) / whole, "passes": passes}


def _work(p: Any) -> tuple[Any, ...]:
    """What the cost model knows of a measured pass's own work: all it prices it from,
    but for a profile with cold calls the bytes the passes before it moved (context,
    which twins do not share)."""
    return (p.op, p.phase, p.kind, p.ckind, p.flops, p.nbytes, p.kernels, p.rows, p.call)


def pass_twins(profile: Any) -> dict[tuple[str, int, str, str], tuple[float, int, float]]:
    """Per pass of a zoo model, ``(model, batch, layer, phase)``: its seconds, how many
    passes of the same work (op, layer kind, compute kind, phase, FLOPs, bytes,
    kernels, rows looked up, layer call or bare kernel) another source of the profile
    measured (a twin in another zoo model or a single-layer benchmark) and the median
    of their seconds; passes without twins are absent. Times as the fit takes them
    (:func:`calibration.calibrate.points_from_raw`): a layer's own time where
    the profile has it, else the time charged to it."""
    raw = profile.measurement.raw or {}
    pts = [p for p in points_from_raw(raw, dense_sparse_grad=profile.corrections.dense_sparse_grad is not None,
                                      weight_grad_only=profile.corrections.weight_grad_only_bwd is not None) if p.t_s > 0]
    same: dict[tuple[Any, ...], list[Any]] = {}
    for p in pts:
        same.setdefault(_work(p), []).append(p)
    out: dict[tuple[str, int, str, str], tuple[float, int, float]] = {}
    for p in pts:
        if p.model not in raw.get("models", {}):
            continue
        others = [q.t_s for q in same[_work(p)] if q.model != p.model]
        if others:
            out[(p.model, p.batch, p.layer, p.phase)] = (p.t_s, len(others), float(np.median(others)))
    return out


def twin_floor(profile: Any) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (zoo model, batch): its passes with twins (:func:`pass_twins`), each against
    the median of its twins' times: ``{"passes": n, "median_abs_err": median
    |t / median(twins) - 1|}``.

    Without cold calls the cost model prices a pass's own time from its work alone,
    so on these passes a fit that predicted each pass's twins' median exactly would
    miss by this much; with them, passes of equal work after different passes are
    priced apart, and this is how far their context alone moves them.
    """
    return _twin_rows(pass_twins(profile))


def _twin_rows(by_pass: dict[tuple[str, int, str, str], tuple[float, int, float]]
               ) -> dict[tuple[str, int], dict[str, Any]]:
    errs: dict[tuple[str, int], list[float]] = {}
    for (model, batch, _layer, _phase), (t, _n, twin) in by_pass.items():
        errs.setdefault((model, batch), []).append(abs(t / twin - 1))
    return {k: {"passes": len(v), "median_abs_err": float(np.median(v))} for k, v in errs.items()}


def noise_floor(raw: dict[str, Any]) -> dict[str, Any]:
    """How precisely the per-layer times are known, from one profile's ``raw``.

    ``se_*``: the standard error of each layer pass's median over its repeats,
    relative, estimated from the recorded relative IQR and repeat count as for
    normal samples: ``1.2533 * (rel_iqr / 1.349) / sqrt(reps)``.
    ``same_sig_*``: layers of one signature in one model run (repeated blocks):
    each pass against the median of the others, ``|t / median(others) - 1|``;
    what any model of the layer record alone cannot do better than.
    """
    se: list[float] = []
    same: list[float] = []
    for name, runs in raw.get("models", {}).items():
        sig = {ly.name: ly.signature for ly in model_variants.model(name).layers}
        for run in runs:
            n = float(run.get("reps", 0))
            groups: dict[tuple[str, int], list[float]] = {}
            for lname, vals in run["layers"].items():
                if n > 0:
                    se += [1.2533 * (float(v) / 1.349) / n**0.5 for v in vals[2:4]]
                if lname in sig:
                    for ph in (0, 1):
                        groups.setdefault((sig[lname], ph), []).append(float(vals[ph]))
            for ts in groups.values():
                for i, t in enumerate(ts):
                    others = ts[:i] + ts[i + 1:]
                    m = float(np.median(others)) if others else 0.0
                    if m > 0:
                        same.append(abs(t / m - 1))

    def q(xs: list[float], p: float) -> float | None:
        return float(np.percentile(xs, p)) if xs else None

    return {"layer_passes": len(se), "se_median": q(se, 50), "se_p90": q(se, 90),
            "same_sig_passes": len(same), "same_sig_median": q(same, 50), "same_sig_p90": q(same, 90)}


def repeatability(a: Any, b: Any) -> dict[str, Any]:
    """Relative differences between two profiles' per-layer times and iterations.

    Overall: every layer pass's charged time (``layers``) and every whole
    iteration. ``rows``: one per model and batch both profiles measured, with
    ``model``, ``batch``, ``passes`` (layer passes both measured, time > 0),
    ``layer_ref`` (``"own"``, ``"charged"`` or ``"own and charged"``: each layer is
    compared on its own time where both runs have one, as the leave-one-out
    error takes it, else on its charged time), ``layer_median_abs_diff`` (the
    median of ``|t_b / t_a - 1|`` over those passes; None without any) and
    ``iter_diff`` (``iter_b / iter_a - 1``). A row whose measurement moves this
    much between two profiles of one machine cannot be expected to be predicted
    closer than that.
    """
    ra, rb = a.measurement.raw or {}, b.measurement.raw or {}
    layer, whole, rows = [], [], []
    for name, runs in ra.get("models", {}).items():
        other = {int(r["batch"]): r for r in rb.get("models", {}).get(name, [])}
        for run in runs:
            o = other.get(int(run["batch"]))
            if o is None:
                continue
            whole.append(abs(o["iter_s"] - run["iter_s"]) / run["iter_s"])
            for k, v in run["layers"].items():
                w = o["layers"].get(k)
                if w is None:
                    continue
                for x, y in ((v[0], w[0]), (v[1], w[1])):
                    if x > 0:
                        layer.append(abs(y - x) / x)
            own_a, own_b = run.get("own") or {}, o.get("own") or {}
            diffs, refs = [], set()
            for k, v in run["layers"].items():
                if k not in o["layers"]:
                    continue
                mine = k in own_a and k in own_b
                ta, tb = (own_a[k], own_b[k]) if mine else (v, o["layers"][k])
                for x, y in ((ta[0], tb[0]), (ta[1], tb[1])):
                    if x > 0 and y > 0:
                        diffs.append(abs(y / x - 1))
                        refs.add("own" if mine else "charged")
            rows.append({"model": name, "batch": int(run["batch"]), "passes": len(diffs),
                         "layer_ref": " and ".join(sorted(refs, reverse=True)) or None,
                         "layer_median_abs_diff": float(np.median(diffs)) if diffs else None,
                         "iter_diff": o["iter_s"] / run["iter_s"] - 1})
    return {
        "layer_passes": len(layer),
        "layer_median_abs_diff": float(np.median(layer)) if layer else None,
        "layer_p90_abs_diff": float(np.percentile(layer, 90)) if layer else None,
        "iterations": len(whole),
        "iter_median_abs_diff": float(np.median(whole)) if whole else None,
        "iter_max_abs_diff": float(np.max(whole)) if whole else None,
        "spread_a": a.measurement.spread, "spread_b": b.measurement.spread,
        "rows": rows,
    }


def print_report(rows: list[dict[str, Any]], rep: dict[str, Any] | None,
                 noise: dict[str, Any] | None = None, drift: dict[str, Any] | None = None) -> bool:
    print("leave-one-model-out: fit on the other zoo models + single-layer benchmarks, "
          "predict the held-out model (no per-layer tables)")
    refs = {r.get("layer_ref", "charged") for r in rows}
    print("per-layer reference: " + " and ".join(
        {"own": "each layer's own brackets (prediction without the glue charged to it)",
         "charged": "the time charged to each layer (its own brackets and glue)"}[x]
        for x in sorted(refs, reverse=True)))
    print(f"{'model':<12}{'batch':>6}{'passes':>7}{'med |layer err|':>17}{'p90':>8}"
          f"{'iter pred s':>13}{'iter meas s':>13}{'iter err':>10}{'glue':>7}{'L/it':>7}  ok"
          + (f"  {'repeat layer / iter':<20}" if rep is not None else "") + "  twins")
    again = {(x["model"], x["batch"]): x for x in (rep or {}).get("rows", [])}
    ok_all = True
    for r in rows:
        ok = r["layer_median_abs_err"] <= LAYER_TARGET and abs(r["iter_err"]) <= ITER_TARGET
        ok_all &= ok
        print(f"{r['model']:<12}{r['batch']:>6}{r['layer_passes']:>7}"
              f"{100 * r['layer_median_abs_err']:>16.1f}%{100 * r['layer_p90_abs_err']:>7.0f}%"
              f"{r['iter_pred_s']:>13.4g}{r['iter_meas_s']:>13.4g}{100 * r['iter_err']:>+9.1f}%"
              f"{100 * r['glue_frac']:>6.1f}%{r['layers_over_iter']:>7.2f}  {'yes' if ok else 'NO ':<3}"
              + (f"  {_again(again.get((r['model'], r['batch']))):<20}" if rep is not None else "")
              + f"  {_twins(r)}")
    print(f"targets: median |layer err| <= {LAYER_TARGET:.0%}, |iter err| <= {ITER_TARGET:.0%} "
          f"(glue: share of the hooked iteration outside the layers' own brackets, charged to "
          f"neighbouring layers; L/it: measured layer times summed over the iteration timed "
          f"without hooks; twins: the row's passes whose work another model or benchmark of the "
          f"profile measured too, and their median |error| against those twins' median time: "
          f"how far a cost model of a layer's work alone is off on them even if it predicted "
          f"their twins exactly"
          + ("; repeat: the same row in the second profile, median |per-layer difference| "
             "(against the same per-layer reference where both profiles have it) and the "
             "iteration's difference: how far the measurement itself moves" if rep is not None
             else "") + ")")
    if noise is not None and noise["se_median"] is not None:
        line = (f"noise floor: standard error of a layer pass's median {100 * noise['se_median']:.1f}% "
                f"(p90 {100 * noise['se_p90']:.1f}%, from the recorded IQR and repeats)")
        if noise["same_sig_median"] is not None:
            line += (f"; layers of one signature in one run differ by {100 * noise['same_sig_median']:.1f}% "
                     f"(p90 {100 * noise['same_sig_p90']:.1f}%, {noise['same_sig_passes']} passes)")
        print(line)
    if drift is not None:
        print(drift_line(drift))
    if rep is not None:
        print("repeatability (two profiles of this machine): per-layer |diff| median "
              f"{100 * rep['layer_median_abs_diff']:.1f}% (p90 {100 * rep['layer_p90_abs_diff']:.1f}%), "
              f"whole iteration |diff| median {100 * rep['iter_median_abs_diff']:.1f}% "
              f"(max {100 * rep['iter_max_abs_diff']:.1f}%)")
        print(f"recorded spread (relative IQR of repeats): first {json.dumps(rep['spread_a'])}")
        print(f"                                           second {json.dumps(rep['spread_b'])}")
    return ok_all


def _again(x: dict[str, Any] | None) -> str:
    """The ``repeat`` cell of a row: its median |per-layer difference| and its
    iteration's difference between the two profiles ("-" for what is missing)."""
    if x is None:
        return "-"
    layer = "-" if x["layer_median_abs_diff"] is None else f"{100 * x['layer_median_abs_diff']:5.1f}%"
    return f"{layer:>6} / {100 * x['iter_diff']:+5.1f}%"


def _twins(r: dict[str, Any]) -> str:
    if not r.get("twin_passes"):
        return "-"
    return f"{r['twin_passes']}: {100 * r['twin_median_abs_err']:.1f}%"


def print_passes(rows: list[dict[str, Any]]) -> None:
    """Every pass of the rows' held-out model: predicted and measured microseconds."""
    for r in rows:
        print(f"{r['model']} at batch {r['batch']} (held out): median |err| "
              f"{100 * r['layer_median_abs_err']:.1f}% over {r['layer_passes']} passes")
        print(f"  {'layer':<32}{'op':<13}{'phase':<6}{'pred us':>11}{'meas us':>11}{'err':>9}"
              f"{'twins':>7}{'twin us':>10}")
        for p in r["passes"]:
            tw = (f"{p['twins']:>7}{1e6 * p['twin_s']:>10.1f}" if p.get("twin_s") is not None
                  else f"{'-':>7}{'-':>10}")
            print(f"  {p['layer']:<32}{p['op']:<13}{p['phase']:<6}{1e6 * p['pred_s']:>11.1f}"
                  f"{1e6 * p['meas_s']:>11.1f}{100 * p['err']:>+8.1f}%{tw}")
        print("  (twins: passes of the same work another model or benchmark measured; twin us: "
              "their median)")


#: What draws the ``--plot`` figure: ``(rows, png path, title) -> the path written``
#: (``python -m bench.calibration_accuracy`` passes :func:`experiments.plots.calibration_figure`).
Figure = Callable[[list[dict[str, Any]], str, str], Path]


def main(argv: Sequence[str] | None = None, figure: Figure | None = None) -> int:
    """The bench's command line; ``figure`` draws ``--plot`` (without it ``--plot`` is
    refused: the figure belongs to :mod:`experiments.plots`, a layer above this one)."""
    ap = argparse.ArgumentParser(prog="python -m bench.calibration_accuracy", description=__doc__)
    ap.add_argument("profile", help="a measured profile (hetsim profile)")
    ap.add_argument("--repeat", help="a second profile of the same machine (repeatability)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--passes", metavar="MODEL",
                    help="hold out this zoo model alone and list its every pass, predicted and measured "
                         "(with --json: its rows, passes included)")
    ap.add_argument("--plot", metavar="PNG",
                    help="also draw the figure: every held-out pass, predicted against measured, "
                         "and each row's errors against the targets")
    a = ap.parse_args(argv)
    if a.passes is not None and a.repeat:
        print("error: --passes lists one profile's passes; leave out --repeat", file=sys.stderr)
        return 2
    try:  # before the minutes of fitting: a figure that cannot be written, a file that is no profile
        if a.plot is not None:
            if Path(a.plot).suffix != ".png":
                raise ConfigError(a.plot, "--plot", "a figure file name must end in .png")
            prepare_out(Path(a.plot).parent, "--plot")
            if figure is None:
                raise ConfigError("<command line>", "--plot", "no figure maker here: run "
                                  "python -m bench.calibration_accuracy")
        prof = load_profile_file(a.profile)
        again = load_profile_file(a.repeat) if a.repeat else None
    except ConfigError as e:
        print(f"error: {e.line()}", file=sys.stderr)
        return 2
    if a.passes is not None:
        models = list((prof.measurement.raw or {}).get("models", {}))
        if a.passes not in models:
            print(f"error: {a.profile}: --passes {a.passes}: the profile measured no such model "
                  f"(it has: {', '.join(models) or 'none'})", file=sys.stderr)
            return 2
        rows = loo_rows(prof, only=a.passes)
        if a.json:
            print(json.dumps(rows, indent=2))
        else:
            print_passes(rows)
        return 0
    rows = loo_rows(prof)
    rep = repeatability(prof, again) if again is not None else None
    noise = noise_floor(prof.measurement.raw or {})
    drift = drift_of(prof.measurement.raw or {})
    if a.json:
        print(json.dumps({"loo": rows, "noise_floor": noise, "drift": drift, "repeatability": rep},
                         indent=2))
        return 0
    ok = print_report(rows, rep, noise, drift)
    if a.plot is not None and figure is not None:
        name = Path(a.profile).stem
        print(f"figure: {figure(rows, a.plot, f'{name}: leave-one-model-out accuracy')}")
    return 0 if ok else 1
