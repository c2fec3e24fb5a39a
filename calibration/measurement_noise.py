"""Measurement noise: how far repeated measurements of one zoo model on this machine
differ, and what that leaves of the calibration targets.

    python -m bench.measurement_noise                          # mlp at 16 and 64, 10 trials
    python -m bench.measurement_noise --models mlp:16 ctr_dnn:32,128 --trials 6 --rounds 8
    python -m bench.measurement_noise --profile hardware_profiles/measured/lab/amd_cold.json
    python -m bench.measurement_noise --load results/noise/trials.json --json

Each trial builds the model afresh and times it as ``hetsim profile`` does
(:func:`calibration.profiler.measure_models`: its rounds, repeats and
percentile; only the chosen models are interleaved, without the profile's
benchmarks between them), so a trial is close to what one profile records. The
trials are run one after the other in this process and saved (``--out``) before
anything is reported; ``--load`` reports saved ones again.

Per model and batch size the report gives:

* the whole iteration (timed without hooks) over the trials: median, min, max
  and ``floor`` = (max - min) / (max + min), the smallest error one prediction
  can have against every trial (the prediction 2 max min / (max + min));
* ``pass spread``: the median over the layer passes of (max - min) / (max + min)
  of each pass's own time over the trials;
* ``oracle``: a predictor that knew the median over the trials of every pass and
  of the iteration exactly, scored against each trial as the leave-one-model-out
  bench scores a profile (:mod:`calibration.accuracy`): the worst trial's
  median |per-layer error| and |iteration error|, and in how many trials both
  targets hold;
* ``state-aware oracle``: the same prediction times the trial's speed as the
  other models measured it (:func:`state_scales`; only with two models or more).
  A leave-one-model-out fit learns that much of a profile's machine state from
  its other models, so a slow phase every model shares is no floor for it. Where
  even this oracle misses a target in some trials, noise the other models do not
  share is that large: a row no profile can be relied on to meet;
* under the table: in how many trials each oracle meets both targets on every
  row at once;
* with ``--profile``: that profile's leave-one-model-out prediction (curves fitted
  without the model, as in the bench) scored against each trial the same way.
  The profile was measured at another time, so this mixes the machine's drift
  between then and now with the noise.

Not a test: the figures depend on the machine and its neighbours.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from calibration import model_variants
from calibration.accuracy import ITER_TARGET, LAYER_TARGET, run_errors
from calibration.profiler import measure_models, setup_host, spec_for
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
from sim import zoo

DEFAULT_MODELS = ("mlp:16,64",)
DEFAULT_OUT = "results/noise/trials.json"


def parse_models(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["mlp:16,64", "ctr_dnn:32"]`` -> ``{"mlp": (16, 64), "ctr_dnn": (32,)}``.

    Raises:
        ConfigError: ``<command line>: --models: ...`` for an unknown zoo model or a
            batch size that is not a positive integer.
    """
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, _, sizes = item.partition(":")
        if name not in zoo.names():
            raise ConfigError("<command line>", "--models", f"unknown zoo model {name!r} "
                              f"(known: {', '.join(zoo.names())})")
        parts = sizes.split(",") if sizes else []
        batches = tuple(int(x) for x in parts if x.isdigit())
        if not parts or len(batches) < len(parts) or min(batches) < 1:
            raise ConfigError("<command line>", "--models",
                              f"{item!r}: give MODEL:B1,B2,... with batch sizes of 1 or more")
        out[name] = tuple(sorted(set(out.get(name, ()) + batches)))
    return out


def run_trials(chosen: dict[str, tuple[int, ...]], trials: int, rounds: int, threads: int,
               progress: bool = True) -> list[dict[str, list[dict[str, Any]]]]:
    """``trials`` measurements of ``chosen`` (model -> batch sizes) on the CPU, each a
    ``raw["models"]`` dict as a full profile's (``spec_for(False)``'s repeats)."""
    from tqdm import tqdm

    dev, _ = setup_host("cpu", threads)
    spec = replace(spec_for(False), models=chosen)
    out = []
    for _ in tqdm(range(trials), desc="trials", unit="trial", disable=not progress):
        out.append(measure_models(chosen, dev, spec, rounds=rounds))
    return out


def _pass_times(run: dict[str, Any]) -> dict[tuple[str, int], float]:
    """Every layer pass of a run with a time: its own time where the run has one
    (as the leave-one-out error takes it), else the time charged to it."""
    out = {}
    for name in run["layers"]:
        ref = own_times(run, name)
        for ph in (0, 1):
            if ref[ph] > 0:
                out[(name, ph)] = float(ref[ph])
    return out


def _common_passes(runs: Sequence[dict[str, Any]]
                   ) -> tuple[list[dict[tuple[str, int], float]], list[tuple[str, int]]]:
    """Each run's :func:`_pass_times`, and the passes every run timed (sorted)."""
    times = [_pass_times(r) for r in runs]
    return times, sorted(set(times[0]).intersection(*times[1:]))


def _runs(trials: Sequence[dict[str, list[dict[str, Any]]]]
          ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(model, batch) -> that run in every trial, in trial order (only the rows
    every trial has)."""
    keyed = [{(m, int(r["batch"])): r for m, runs in t.items() for r in runs} for t in trials]
    common = set(keyed[0]).intersection(*keyed[1:]) if keyed else set()
    return {k: [t[k] for t in keyed] for k in sorted(common)}


def _meets(e: dict[str, Any]) -> bool:
    """Whether one scored run meets both targets."""
    return e["layer_median_abs_err"] <= LAYER_TARGET and abs(e["iter_err"]) <= ITER_TARGET


def _score(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Worst and median over trials of the median |per-layer error| and |iteration
    error|, and how many trials meet both targets."""
    lay = [r["layer_median_abs_err"] for r in rows]
    it = [abs(r["iter_err"]) for r in rows]
    ok = sum(1 for r in rows if _meets(r))
    return {"layer_median_abs_err": {"median": float(np.median(lay)), "max": float(max(lay))},
            "iter_abs_err": {"median": float(np.median(it)), "max": float(max(it))},
            "iter_errs": [float(r["iter_err"]) for r in rows],
            "trials_meeting_targets": ok}


def oracle_errors(runs: Sequence[dict[str, Any]], scale: Sequence[float] | None = None
                  ) -> list[dict[str, Any]]:
    """Per trial, the errors of a prediction of each pass and of the iteration by
    their medians over ``runs`` (the same model and batch in every trial), times
    ``scale[i]`` in trial ``i`` (default 1): ``layer_median_abs_err`` over the
    passes every trial timed, and ``iter_err``."""
    times, keys = _common_passes(runs)
    med = {k: float(np.median([t[k] for t in times])) for k in keys}
    it_med = float(np.median([r["iter_s"] for r in runs]))
    out = []
    for i, (r, t) in enumerate(zip(runs, times)):
        f = 1.0 if scale is None else float(scale[i])
        errs = [abs(f * med[k] / t[k] - 1) for k in keys]
        out.append({"layer_median_abs_err": float(np.median(errs)) if errs else 0.0,
                    "iter_err": f * it_med / float(r["iter_s"]) - 1})
    return out


def state_scales(runs: dict[tuple[str, int], list[dict[str, Any]]]
                 ) -> dict[tuple[str, int], list[float] | None]:
    """Per (model, batch), each trial's machine state as the other models saw it: the
    median over the rows of every *other* model of ``iter_s`` in that trial over that
    row's median ``iter_s`` (None where no other model was measured). A leave-one-
    model-out fit learns this much of a profile's state from the other models, so
    noise every model shares (a slow phase of the host) is no floor for it."""
    ratio = {k: [float(r["iter_s"]) / float(np.median([x["iter_s"] for x in rs])) for r in rs]
             for k, rs in runs.items()}
    out: dict[tuple[str, int], list[float] | None] = {}
    for (m, b), rs in runs.items():
        others = [v for (m2, _), v in ratio.items() if m2 != m]
        out[(m, b)] = ([float(np.median([v[i] for v in others])) for i in range(len(rs))]
                       if others else None)
    return out


def spread(trials: Sequence[dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The spread of the trials and what it leaves of the targets.

    Returns:
        ``rows``: one per (model, batch) every trial measured, with ``iter_s``
        (median, min, max, ``floor``: :func:`half_range`), ``pass_spread`` (median
        over passes of each pass's half range over the trials), ``passes``,
        ``oracle`` (:func:`oracle_errors` scored by :func:`_score`) and
        ``oracle_state`` (the same scaled by :func:`state_scales`; None without
        another model); ``all_rows``: in how many trials each oracle meets both
        targets on every row at once (``oracle_state``: None unless every row has
        one).
    """
    runs = _runs(trials)
    scales = state_scales(runs)
    rows = []
    good = {"oracle": [True] * len(trials), "oracle_state": [True] * len(trials)}
    for (model, b), rs in runs.items():
        its = [float(r["iter_s"]) for r in rs]
        times, keys = _common_passes(rs)
        per = [half_range([t[k] for t in times]) for k in keys]
        plain, sc = oracle_errors(rs), scales[(model, b)]
        state = oracle_errors(rs, sc) if sc is not None else None
        for name, errs in (("oracle", plain), ("oracle_state", state)):
            for i, e in enumerate(errs or []):
                good[name][i] = good[name][i] and _meets(e)
        rows.append({"model": model, "batch": b, "trials": len(rs), "passes": len(keys),
                     "iter_s": {"median": float(np.median(its)), "min": min(its), "max": max(its),
                                "floor": half_range(its)},
                     "pass_spread": float(np.median(per)) if per else None,
                     "oracle": _score(plain),
                     "oracle_state": _score(state) if state is not None else None})
    every_state = bool(rows) and all(r["oracle_state"] is not None for r in rows)
    return {"rows": rows, "all_rows": {"oracle": sum(good["oracle"]),
                                       "oracle_state": sum(good["oracle_state"]) if every_state else None}}


def against(profile: Any, trials: Sequence[dict[str, list[dict[str, Any]]]]
            ) -> dict[tuple[str, int], dict[str, Any]]:
    """``profile``'s leave-one-model-out prediction of every (model, batch) every trial
    has, for each model the profile measured (at any batch sizes: the prediction
    comes from the curves fitted without it), scored against each trial."""
    from calibration.calibrate import fit

    have = set((profile.measurement.raw or {}).get("models", {}))
    runs = _runs(trials)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for name in sorted({m for m, _ in runs} & have):
        fitted, _ = fit(profile, exclude=[name])
        model = model_variants.model(name)
        for (m, b), rs in runs.items():
            if m == name:
                scored = [run_errors(fitted, model, r) for r in rs]
                out[(m, b)] = {**_score(scored), "iter_pred_s": scored[0]["iter_pred_s"]}
    return out


def _oracle_cell(o: dict[str, Any] | None, trials: int) -> str:
    if o is None:
        return "-"
    return (f"{pct(o['layer_median_abs_err']['max'])} / {pct(o['iter_abs_err']['max'])}  "
            f"{o['trials_meeting_targets']}/{trials}")


def print_report(sp: dict[str, Any], prof: dict[tuple[str, int], dict[str, Any]] | None,
                 meta: dict[str, Any], profile_name: str | None) -> None:
    rows, k = sp["rows"], meta["trials"]
    print(f"measurement noise: {k} trials, each model built afresh and timed as "
          f"`hetsim profile` times it ({meta['rounds']} rounds, {meta['threads']} thread(s))")
    print(f"{'model':<12}{'batch':>6}{'passes':>7}  {'iter med ms':>11}{'min':>9}{'max':>9}"
          f"{'floor':>8}{'pass spread':>13}  {'oracle: worst layer / iter, ok':>31}"
          f"  {'state-aware oracle':>24}")
    for r in rows:
        it = r["iter_s"]
        print(f"{r['model']:<12}{r['batch']:>6}{r['passes']:>7}  {1e3 * it['median']:>11.3f}"
              f"{1e3 * it['min']:>9.3f}{1e3 * it['max']:>9.3f}{pct(it['floor']):>8}"
              f"{pct(r['pass_spread'] or 0.0):>13}  {_oracle_cell(r['oracle'], r['trials']):>31}"
              f"  {_oracle_cell(r['oracle_state'], r['trials']):>24}")
    print(f"targets: median |layer err| <= {LAYER_TARGET:.0%}, |iter err| <= {ITER_TARGET:.0%}. floor: "
          "(max - min) / (max + min) of the iteration, the least error one prediction can have "
          "against every trial; pass spread: the same per layer pass (own time), median over "
          "passes; oracle: each pass and the iteration predicted by their medians over the "
          "trials, scored against each trial (worst trial's median |layer err| and |iter err|; "
          "ok: trials meeting both targets); state-aware: the same times each trial's speed as "
          "the other models measured it (what a leave-one-model-out fit can learn of the "
          "machine's state)")
    al = sp["all_rows"]
    state = "" if al["oracle_state"] is None else f", the state-aware oracle in {al['oracle_state']}"
    print(f"every row at once: the oracle meets both targets in {al['oracle']} of {k} trials{state}")
    if prof is None:
        return
    print(f"\n{profile_name}, leave-one-model-out, against each trial (the profile was measured at "
          "another time: its drift since then is in these errors too):")
    print(f"{'model':<12}{'batch':>6}  {'iter pred ms':>12}  {'layer med (median/max)':>23}  "
          f"{'iter err (min..max)':>20}{'ok':>7}")
    for r in rows:
        p = prof.get((r["model"], r["batch"]))
        if p is None:
            continue
        lay = p["layer_median_abs_err"]
        ok = f"{p['trials_meeting_targets']}/{r['trials']}"
        print(f"{r['model']:<12}{r['batch']:>6}  {1e3 * p['iter_pred_s']:>12.3f}  "
              f"{pct(lay['median']) + ' / ' + pct(lay['max']):>23}  "
              f"{pct(min(p['iter_errs'])) + ' .. ' + pct(max(p['iter_errs'])):>20}{ok:>7}")


def _check_trials(trials: Any, meta: Any, path: str) -> None:
    """Saved trials as :func:`main` writes them, or a one-line ConfigError naming the field."""
    if not isinstance(meta, dict) or not isinstance(meta.get("trials"), int):
        raise ConfigError(path, "meta", "needs the trial count, rounds and threads of the run")
    if not isinstance(trials, list) or len(trials) < 2:
        raise ConfigError(path, "trials", "needs two trials or more")
    for i, t in enumerate(trials):
        if not isinstance(t, dict):
            raise ConfigError(path, f"trials[{i}]", "needs model -> list of runs")
        for m, runs in t.items():
            if not isinstance(runs, list):
                raise ConfigError(path, f"trials[{i}].{m}", "needs a list of runs")
            for j, r in enumerate(runs):
                where = f"trials[{i}].{m}[{j}]"
                check_run(r, path, where)
                if not (isinstance(r.get("iter_s"), (int, float)) and r["iter_s"] > 0):
                    raise ConfigError(path, f"{where}.iter_s", "needs a time above 0")
    meta["trials"] = len(trials)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.measurement_noise", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL:B1,B2",
                    help="zoo models and batch sizes to measure (default: mlp:16,64)")
    ap.add_argument("--trials", type=int, default=10, help="measurements of each (default 10)")
    add_run_options(ap, "the trials", DEFAULT_OUT, rounds=8,
                    rounds_help="interleaved rounds per trial, as `hetsim profile --rounds` "
                                "(default 8, a full profile's)",
                    profile_help="also score this profile's leave-one-model-out prediction "
                                 "against every trial")
    a = ap.parse_args(argv)
    try:
        if not a.load:
            if a.trials < 2:
                raise ConfigError("<command line>", "--trials", f"needs 2 or more, got {a.trials}")
            chosen = parse_models(a.models)
        prof, saved = start_run(a)
        if saved is not None:
            try:
                trials, meta = saved["trials"], saved["meta"]
            except (KeyError, TypeError) as e:
                raise ConfigError(a.load, "--load", f"not saved trials of this bench ({e})") from None
            _check_trials(trials, meta, a.load)
        else:
            trials = run_trials(chosen, a.trials, a.rounds, a.threads, progress=not a.json)
            meta = {"trials": a.trials, "rounds": a.rounds, "threads": a.threads,
                    "models": {k: list(v) for k, v in chosen.items()}}
            save_run(a, meta, "trials", trials)
    except ConfigError as e:
        print(f"error: {e.line()}", file=sys.stderr)
        return 2
    sp = spread(trials)
    if not sp["rows"]:
        print(f"error: {a.load or a.out}: trials: no model and batch size is in every trial",
              file=sys.stderr)
        return 2
    try:
        scored = against(prof, trials) if prof is not None else None
    except ValueError as e:
        print(f"error: {a.profile}: measurement.raw: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"meta": meta, **sp, "profile": a.profile,
                          "profile_rows": [{"model": m, "batch": b, **v}
                                           for (m, b), v in sorted((scored or {}).items())]},
                         indent=2))
    else:
        print_report(sp, scored, meta, a.profile)
    return 0
