"""Fit the runtime CPU model (calibration/runtime_cpu.py) to real runs of configs that are not validated.

    python -m bench.runtime_calibration [--out results/runtime_calibration] [--only c1,c3]
        [--report-only [--resimulate]] [--write PROFILE] [--fresh-profile FILE]

Runs `hetsim validate` on each config of experiments/configs/runtime_calibration/
(real runs on this machine, emulated as in the validation suite), takes from each
process its DES figures (compute, transport, messages, processes sharing its cores)
and its real CPU per iteration, fits the model's coefficients per role, and prints
them with the fit's errors per process, in all and leaving each config out in turn
(fit on the others, predict it); then, what the model is for, each run's mean
iteration time as the DES predicts it alone, with the fit and with the fit to the
other configs only (:func:`iteration_rows`, the simulated side of `hetsim validate`
again without the real run). ``--write PROFILE`` stores the fit in that profile's
``network.runtime_cpu`` (the rest of the profile unchanged), from where `hetsim
validate` applies it. ``--fresh-profile FILE`` prices every rank of the calibration
runs with this machine's profile FILE (measured into it first when missing, as `hetsim
validate --fresh-profile` does); with ``--write FILE`` the fit then completes that
profile, so that `hetsim validate --fresh-profile FILE` uses a runtime CPU model of this
machine (the iteration-time table, priced with the configs' own profiles, is left out). ``--report-only`` refits from OUT/*/validation.json without
running anything; with ``--resimulate`` from the DES figures of those runs again, as the DES
is now (after a change to the DES: the real CPU is as recorded, the model's inputs are
not). Writes OUT/calibration.json and OUT/report.md.

The validation suite's configs (experiments/configs/validation/) are never used
here: the suite measures the model out of sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from calibration import runtime_cpu
from calibration.fresh_profile import fresh_profile as fresh_profile_of
from calibration.profiler import write_profile
from experiments import validate
from experiments.plots import markdown_table
from experiments.validate_headline import pct
from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from hardware_profiles.schema import DeviceProfile, NetworkMeasurement
from sim.cluster import Host

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "experiments" / "configs" / "runtime_calibration"
#: the torch threads of every calibration config's ranks (``runtime.threads``)
CALIBRATION_THREADS = 1


def samples_of(v: validate.Validation, figures: Sequence[dict[str, runtime_cpu.Figures]] | None = None
               ) -> list[tuple[str, runtime_cpu.Figures, float]]:
    """``(label, DES figures, real CPU ms per iteration)`` of every process of every run of
    ``v`` that has both (the figures are those of the DES before any runtime CPU model: as
    recorded, or ``figures``, one dict per run, e.g. :func:`experiments.validate.first_figures`)."""
    out = []
    for k, r in enumerate(v.runs):
        if figures is not None:
            figs = figures[k]
        else:
            figs = {dev: runtime_cpu.Figures(**f)
                    for dev, f in ((r.diagnostics.get("runtime_cpu") or {}).get("figures") or {}).items()}
        cpu = r.diagnostics.get("cpu_per_iteration") or {}
        for dev, f in figs.items():
            real = cpu.get("processes", {}).get(dev, {}).get("real_ms")
            if real:
                out.append((f"{v.name}|{r.scheduler}|{dev}", f, float(real)))
    return out


def runs_of(v: validate.Validation) -> list[dict[str, Any]]:
    """What :func:`iteration_rows` needs of each run of ``v`` to simulate it again: its
    config, scheduler, host (cores, background load as recorded) and real mean iteration."""
    return [{"config": v.name, "scheduler": r.scheduler, "cores": r.diagnostics["host"]["cores"],
             "background_threads": r.diagnostics["host"]["background_threads"],
             "real_s": r.metrics["iteration_time_mean_s"]["real"]}
            for r in v.runs if r.metrics["iteration_time_mean_s"]["real"] and "host" in r.diagnostics]


def iteration_rows(runs: list[dict[str, Any]], samples: list[tuple[str, runtime_cpu.Figures, float]],
                   model: runtime_cpu.RuntimeCpuModel) -> list[dict[str, Any]]:
    """Per run, the mean iteration time the DES predicts (its simulated side, without a
    real run: :func:`experiments.validate.resimulate`) alone, with ``model`` and with the
    model fitted to every other config's samples, against the real one: what the model is
    for, measured on configs it did not see."""
    rows = []
    for run in runs:
        cfg = run["config"]
        left_out = fitted([x for x in samples if x[0].split("|")[0] != cfg])
        got = validate.resimulate(CONFIG_DIR / f"{cfg}.yaml", run["scheduler"],
                                  Host("local", run["cores"], run["background_threads"]),
                                  {"fit": model, "left_out": left_out})
        real = run["real_s"]
        rows.append({"config": cfg, "scheduler": run["scheduler"], "real_ms": round(1e3 * real, 2),
                     "des_ms": round(1e3 * got[""], 2), "des_error": validate.pct(got[""] / real - 1),
                     "fit_ms": round(1e3 * got["fit"], 2), "fit_error": validate.pct(got["fit"] / real - 1),
                     "left_out_ms": round(1e3 * got["left_out"], 2),
                     "left_out_error": validate.pct(got["left_out"] / real - 1),
                     "_errors": (got[""] / real - 1, got["fit"] / real - 1, got["left_out"] / real - 1)})
    return rows


def fitted(samples: list[tuple[str, runtime_cpu.Figures, float]], note: str = "") -> runtime_cpu.RuntimeCpuModel:
    """:func:`calibration.runtime_cpu.fit_configs` of labelled samples (configs: the label's
    first field): each role's ridge chosen by leaving each config out."""
    return runtime_cpu.fit_configs([(lab.split("|")[0], f, r) for lab, f, r in samples], note)


def leave_one_out(samples: list[tuple[str, runtime_cpu.Figures, float]]) -> dict[str, float]:
    """Per sample, the relative error of its prediction by the model fitted to every other
    config's samples (configs: the label's first field)."""
    configs = sorted({s[0].split("|")[0] for s in samples})
    out = {}
    for c in configs:
        model = fitted([x for x in samples if x[0].split("|")[0] != c])
        for lab, f, r in samples:
            if lab.split("|")[0] == c:
                out[lab] = model.predict_ms(f) / r - 1.0
    return out


def fit_report(samples: list[tuple[str, runtime_cpu.Figures, float]],
               note: str) -> tuple[runtime_cpu.RuntimeCpuModel, pd.DataFrame, dict[str, Any]]:
    """The fit on every sample, a row per process and the summary figures."""
    model = fitted(samples, note)
    loo = leave_one_out(samples) if len({s[0].split("|")[0] for s in samples}) > 1 else {}
    rows = []
    for lab, f, r in samples:
        cfg, sched, dev = lab.split("|")
        rows.append({"config": cfg, "scheduler": sched, "process": dev, "role": f.role, "m": round(f.sharing, 2),
                     "compute_ms": round(f.compute_ms, 2), "transport_ms": round(f.transport_ms, 2),
                     "messages": round(f.messages, 1), "des_ms": round(f.sim_ms, 2), "real_ms": round(r, 2),
                     "des_error": validate.pct(f.sim_ms / r - 1), "fit_ms": round(model.predict_ms(f), 2),
                     "fit_error": validate.pct(model.predict_ms(f) / r - 1),
                     "left_out_error": validate.pct(loo.get(lab))})

    def med(xs: list[float]) -> float | None:
        return statistics.median(abs(x) for x in xs) if xs else None

    summary = {"processes": len(samples),
               "des_median_abs_error": med([f.sim_ms / r - 1 for _, f, r in samples]),
               "fit_median_abs_error": med([model.predict_ms(f) / r - 1 for _, f, r in samples]),
               "left_out_median_abs_error": med(list(loo.values()))}
    return model, pd.DataFrame(rows), summary


def saved_samples(out: Path, stems: list[str], resimulate: bool = False, profile: Path | None = None
                  ) -> tuple[list[tuple[str, runtime_cpu.Figures, float]], list[dict[str, Any]]] | None:
    """The samples and runs (:func:`runs_of`) of the configs ``stems`` from
    OUT/STEM/validation.json where every one exists, else from OUT/calibration.json's
    ``samples`` (unrounded, as fitted) and ``runs`` (none in a file from before they were
    kept); None without either. ``resimulate``: the samples' DES figures from the DES as
    it is now (:func:`experiments.validate.first_figures`, priced with ``profile`` where
    given, the ``--fresh-profile`` the runs had), not as recorded; needs the
    validation.json files."""
    files = [out / s / "validation.json" for s in stems]
    if all(f.is_file() for f in files):
        vs = [validate.Validation.from_json(json.loads(f.read_text())) for f in files]
        if resimulate and profile is None:
            fresh = [f for f, v in zip(files, vs) for r in v.runs
                     if any("--fresh-profile" in str(x) for x in (r.diagnostics.get("profiles") or {}).values())]
            if fresh:
                raise ConfigError(str(fresh[0]), "profiles", "priced with a --fresh-profile: give that "
                                  "--fresh-profile FILE to --resimulate")
        prof = load_profile_file(profile) if resimulate and profile is not None else None
        return ([x for v in vs for x in samples_of(v, validate.first_figures(v, prof) if resimulate else None)],
                [x for v in vs for x in runs_of(v)])
    if resimulate:
        return None
    cal = out / "calibration.json"
    if not cal.is_file() or "samples" not in (data := json.loads(cal.read_text())):
        return None
    return ([(x["label"], runtime_cpu.Figures(**x["figures"]), float(x["real_ms"])) for x in data["samples"]
             if x["label"].split("|")[0] in stems],
            [x for x in data.get("runs", []) if x["config"] in stems])


def write_model(profile_path: Path, model: runtime_cpu.RuntimeCpuModel) -> None:
    """Store ``model`` in the profile's ``network.runtime_cpu``, the rest unchanged."""
    prof = DeviceProfile.model_validate(json.loads(profile_path.read_text()))
    net = prof.network.model_dump() if prof.network is not None else {}
    net["runtime_cpu"] = model.to_json()
    write_profile(prof.model_copy(update={"network": NetworkMeasurement(**net)}), profile_path)


def fresh_machine(path: Path, threads: int, on_step: Callable[[str], None] | None = None,
                  also: Sequence[Path] = ()) -> DeviceProfile:
    """This machine's profile in ``path``, complete: measured (:func:`calibration.fresh_profile.fresh_profile`,
    timing the models of the calibration configs, the validation suite's and ``also``'s:
    :func:`experiments.validate.fresh_models`) where ``path`` does not exist, then, where it has no runtime CPU model yet
    (``network.runtime_cpu``), that model fitted to real runs of the calibration configs
    priced with it and stored in it (what ``hetsim validate --fresh-profile`` and the
    suite's ``--fresh-profile`` use). The runs go to PATH_STEM.calibration/ beside it; a
    config whose run is there already is not run again (an interrupted fit resumes).
    ``threads`` other than the calibration configs' (1): the profile alone, without the
    model (the validation then says it ran without one).

    Raises:
        ConfigError: ``path`` is not a usable fresh profile (one line), or a calibration
            config cannot run.
        runtime.launch.RuntimeFailure: a calibration run failed.
    """
    configs = sorted(CONFIG_DIR.glob("*.yaml"))
    models = validate.fresh_models([*configs, *sorted(validate.SUITE_DIR.glob("*.yaml")), *also])
    prof, _ = fresh_profile_of(path, threads, progress=on_step is not None, models=models)
    if prof.network is not None and prof.network.runtime_cpu is not None or threads != CALIBRATION_THREADS:
        return prof
    runs = path.with_name(path.stem + ".calibration")
    samples = []
    for i, c in enumerate(configs):
        saved = runs / c.stem / "validation.json"
        if saved.is_file():
            v = validate.Validation.from_json(json.loads(saved.read_text()))
        else:
            if on_step:
                on_step(f"runtime CPU model: [{i + 1}/{len(configs)}] {c.stem}")
            v = validate.validate(c, out=runs / c.stem, fresh_profile=path)
        samples += samples_of(v)
    if not samples:
        raise ConfigError(str(CONFIG_DIR), "runtime", "no calibration run has both DES figures and real CPU")
    names = ", ".join(dict.fromkeys(lab.split("|")[0] for lab, _, _ in samples))
    model = fitted(samples, f"hetsim validate --fresh-profile, fitted {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
                            f"UTC: {len(samples)} processes of {names}")
    write_model(path, model)
    return load_profile_file(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/runtime_calibration")
    ap.add_argument("--only", help="comma-separated config name prefixes (c1,c3)")
    ap.add_argument("--report-only", action="store_true",
                    help="refit from OUT/*/validation.json, or from OUT/calibration.json's samples")
    ap.add_argument("--resimulate", action="store_true",
                    help="with --report-only: the DES figures of the saved runs from the DES as it is now "
                         "(after a change to the DES), not as recorded; with --fresh-profile FILE, priced with FILE")
    ap.add_argument("--write", metavar="PROFILE", help="store the fit in this profile's network.runtime_cpu")
    ap.add_argument("--fresh-profile", metavar="FILE", type=Path,
                    help="price every rank with this machine's profile FILE (measured first when missing)")
    args = ap.parse_args(argv)
    if args.resimulate and not args.report_only:
        ap.error("--resimulate works on saved runs: give --report-only too")
    out = Path(args.out)
    configs = sorted(CONFIG_DIR.glob("*.yaml"))
    if args.only:
        keep = tuple(x.strip() for x in args.only.split(",") if x.strip())
        configs = [c for c in configs if c.stem.startswith(keep)]
    t0 = time.monotonic()
    previous = out / "calibration.json"
    runs: list[dict[str, Any]] = []
    if args.report_only:
        if args.resimulate and args.fresh_profile is not None and not args.fresh_profile.is_file():
            print(f"{args.fresh_profile}: no such profile (--resimulate prices the saved runs with it)",
                  file=sys.stderr)
            return 2
        try:
            saved = saved_samples(out, [c.stem for c in configs], args.resimulate, args.fresh_profile)
        except ConfigError as e:
            print(e, file=sys.stderr)
            return 2
        if saved is None:
            need = ("*/validation.json of every config" if args.resimulate
                    else "neither */validation.json of every config nor calibration.json with samples")
            print(f"{out}: {need} (run without --report-only first)", file=sys.stderr)
            return 2
        samples, runs = saved
        if args.fresh_profile is not None:  # the iteration table prices with the configs' own profiles
            runs = []
    else:
        samples = []
        for i, c in enumerate(configs):
            print(f"[{i + 1}/{len(configs)}] {c.stem} ...", flush=True)
            v = validate.validate(c, out=out / c.stem, fresh_profile=args.fresh_profile)
            samples += samples_of(v)
            if args.fresh_profile is None:  # resimulate prices with the config's own profiles
                runs += runs_of(v)
    if not samples:
        print("no process has both DES figures and real CPU", file=sys.stderr)
        return 2
    names = list(dict.fromkeys(lab.split("|")[0] for lab, _, _ in samples))
    note = (f"bench.runtime_calibration, fitted {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC: "
            f"{len(samples)} processes of {', '.join(names)}")
    model, df, summary = fit_report(samples, note)
    coef = pd.DataFrame([{"role": role, **dict(zip(runtime_cpu.TERMS, model.coef(role)))} for role in
                         runtime_cpu.ROLES])
    text = ["# Runtime CPU model: fit", "", model.note, "",
            "cpu = a compute + b compute (m - 1) + c transport + d messages (ms per iteration; d in ms per "
            "message end)", "", markdown_table(coef.round(4)), "",
            f"Median |error| per process: the DES alone {pct(summary['des_median_abs_error'], sign=False)}, the fit "
            f"{pct(summary['fit_median_abs_error'], sign=False)}, each config left out of the fit "
            f"{pct(summary['left_out_median_abs_error'], sign=False)}.", "", markdown_table(df), ""]
    if runs:  # what the model is for: the iteration times, each config predicted by the fit without it
        it_rows = iteration_rows(runs, samples, model)
        errs = list(zip(*(r.pop("_errors") for r in it_rows), strict=True))
        med = [statistics.median(abs(x) for x in e) for e in errs]
        summary.update({"iteration_des_median_abs_error": med[0], "iteration_fit_median_abs_error": med[1],
                        "iteration_left_out_median_abs_error": med[2]})
        text += ["## Mean iteration time", "",
                 "The DES's simulated side of each run again (experiments.validate.resimulate: the same host "
                 "and background load, no real run) alone, with the fit, and with the fit to the other configs "
                 "only, against the real run.", "",
                 f"Median |error|: the DES alone {pct(med[0], sign=False)}, the fit {pct(med[1], sign=False)}, each config left out "
                 f"of the fit {pct(med[2], sign=False)}.", "", markdown_table(pd.DataFrame(it_rows)), ""]
    atomic_write(out / "report.md", "\n".join(text))
    wall: float | None = time.monotonic() - t0
    if args.report_only:  # nothing ran: keep the runs' own wall time (None where unknown)
        wall = json.loads(previous.read_text()).get("wall_s") if previous.is_file() else None
    atomic_write(out / "calibration.json", json.dumps({
        "model": model.to_json(), "summary": summary, "wall_s": wall, "rows": df.to_dict("records"),
        "samples": [{"label": lab, "figures": dataclasses.asdict(f), "real_ms": r} for lab, f, r in samples],
        "runs": runs},
        indent=1) + "\n")
    print("\n".join(text[:9]))
    if "iteration_left_out_median_abs_error" in summary:
        print(f"Mean iteration time, median |error|: the DES alone {pct(summary['iteration_des_median_abs_error'], sign=False)}, "
              f"the fit {pct(summary['iteration_fit_median_abs_error'], sign=False)}, each config left out "
              f"{pct(summary['iteration_left_out_median_abs_error'], sign=False)}")
    if args.write:
        write_model(Path(args.write), model)
        print(f"stored in {args.write} (network.runtime_cpu)")
    return 0
