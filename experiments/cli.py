"""The `hetsim` command.

Every command that takes --out writes summary.json, iterations.csv,
trace.json, plan.json and config.json there (compare and demo: one folder per
run plus comparison.csv; sweep: results.csv plus runs/POINT_ID/). Bad input
exits 2 with one line naming the file and field; nothing already written is
removed.

This module imports only the standard library at start-up, so that `hetsim
--help` and `--version` answer fast (bench/cli_startup.py times them); each verb
imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import select
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

# Copies of names defined in heavy modules, so that building the parser imports
# none of them; tests/test_cli_options.py checks each against its source.
EVALUATORS = ("des", "analytic")  # sim.evaluate.EVALUATORS
BACKENDS = ("local", "dask")  # experiments.sweep.BACKENDS
MAX_POINTS = 50_000  # experiments.sweep.MAX_POINTS
#: The built-in schedulers by kind (schedulers.BUILTIN).
BUILTIN_SCHEDULERS = {
    "training": ("bruteforce", "cpu_only", "equal", "exact", "genetic", "gpu_only", "greedy", "hps",
                 "lbbsp", "proportional", "rl"),
    "dag": ("energy", "heft", "milp", "rl-dag"),
}
ENTRY_POINT_GROUP = "hetsim.schedulers"  # schedulers.base.ENTRY_POINT_GROUP

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
DEMO_MODELS = ("resnet18", "ctr_dnn")
DEMO_SCHEDULERS = ("equal", "proportional")
#: exit status of a sweep that wrote every row but has points whose status is error
SWEEP_FAILED = 1


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "-" if x is None else str(x)


def print_table(rows: list[dict[str, Any]], cols: Sequence[str]) -> None:
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


#: Columns a comparison table shows only where its rows differ (said once above it otherwise).
SHARED_COLS = {"plan_kind": "{}", "sync": "sync {}", "staleness_bound": "staleness bound {}",
               "throughput_window": "throughput window {}"}


def print_comparison(rows: list[dict[str, Any]], cols: Sequence[str]) -> None:
    """:func:`print_table` of a comparison, with the :data:`SHARED_COLS` that every row has
    alike said once in a line above it ("all plans: data_parallel, sync bsp, ...")."""
    same = [c for c in cols if c in SHARED_COLS and len({_fmt(r.get(c)) for r in rows}) == 1]
    if same:
        print("all plans: " + ", ".join(SHARED_COLS[c].format(_fmt(rows[0].get(c))) for c in same))
    print_table(rows, [c for c in cols if c not in same])


SUMMARY_COLS = ("scheduler", "evaluator", "throughput_sps", "iteration_time_mean_s", "elapsed_s",
                "time_to_target_s", "cost_usd", "energy_j")
#: compare and demo: each plan's kind, sync mode, staleness bound and throughput window too
COMPARE_COLS = (*SUMMARY_COLS[:2], "plan_kind", "sync", "staleness_bound", *SUMMARY_COLS[2:], "throughput_window")


def _row(result: Any, **extra: Any) -> dict[str, Any]:
    return {**extra, "scheduler": result.scheduler, "evaluator": result.evaluator, **result.headline()}


def _compare_row(result: Any, plan: Any, job: Any, **extra: Any) -> dict[str, Any]:
    """A comparison row: :func:`_row`, then how the plan's updates were applied
    (:func:`experiments.runner.update_columns`)."""
    from experiments.runner import update_columns

    return {**_row(result, **extra), **update_columns(result, plan, job)}


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as a CSV file, written atomically."""
    cols = list(rows[0]) if rows else []
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    from hardware_profiles.fileio import atomic_write

    atomic_write(path, buf.getvalue())


def _positive_seconds(text: str) -> float:
    """argparse type of --timeout: a finite number of seconds > 0."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return x


FORCE_HELP = ("run even beyond the size limits (sim/limits.py: devices plus PS shards, iterations, "
              "DES work), which are otherwise refused up front")


# ---------------------------------------------------------------- commands
def cmd_simulate(a: argparse.Namespace) -> int:
    from experiments import runner
    from hardware_profiles.errors import ConfigError
    from hardware_profiles.fileio import prepare_out

    loaded = runner.load(a.config)
    out = prepare_out(a.out or Path("results") / loaded.config.name / a.evaluator)
    if a.plan and a.scheduler:
        raise ConfigError("<command line>", "--plan", "give --plan or --scheduler, not both")
    result, plan = runner.run_one(loaded, a.evaluator, a.scheduler, out, progress=_progress(a),
                                  plan_file=a.plan, force=a.force)
    print_table([_row(result)], SUMMARY_COLS)
    trace = "trace.json, " if (out / "trace.json").is_file() else ""  # none without a timeline (analytic)
    print(f"wrote {out}/ (summary.json, iterations.csv, {trace}plan.json, config.json)")
    return 0


def cmd_dag(a: argparse.Namespace) -> int:
    from experiments import dag_runner
    from hardware_profiles.errors import ConfigError
    from hardware_profiles.fileio import prepare_out

    names = [n for n in a.schedulers.split(",") if n] if a.schedulers else None
    import schedulers

    for n in names or []:
        if n not in schedulers.names("dag"):
            raise ConfigError("<command line>", "--schedulers",
                              f"unknown DAG scheduler {n!r}; known: {', '.join(schedulers.names('dag'))}")
    out = prepare_out(a.out or Path("results") / Path(a.config).stem / "dag")
    rows = dag_runner.run_dag(a.config, names, out, force=a.force)
    write_csv(out / "comparison.csv", rows)
    print_table(rows, ("scheduler", "mode", "plan_frame_ms", "plan_effects_ms", "deadline_ms", "plan_energy_mj",
                       "des_miss_rate", "des_miss_ok", "des_latency_p99_ms", "des_energy_mj"))
    print(f"wrote {out}/comparison.csv, comparison.png and one folder per scheduler")
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    from experiments import runner
    from hardware_profiles.fileio import prepare_file_out
    from sim import limits

    loaded = runner.load(a.config)
    out = prepare_file_out(a.out) if a.out else None
    limits.check_config(loaded.config, loaded.source, a.force)
    problem = runner.problem_of(loaded)
    plan = runner.plan_for(loaded, problem, a.scheduler)
    text = plan.dumps()
    if out is not None:
        from hardware_profiles.fileio import atomic_write

        atomic_write(out, text, "--out")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from experiments import plots, runner
    from hardware_profiles.errors import ConfigError, HetsimError
    from hardware_profiles.fileio import prepare_out

    loaded = runner.load(a.config)
    import schedulers

    names = [s for s in (a.schedulers.split(",") if a.schedulers else schedulers.names()) if s]
    for n in names:
        if n not in schedulers.names():
            raise ConfigError("<command line>", "--schedulers",
                              f"unknown scheduler {n!r}; known: {', '.join(schedulers.names())}")
    out = prepare_out(a.out or Path("results") / loaded.config.name / "compare")
    rows = []
    for n in names:
        try:
            result, plan = runner.run_one(loaded, a.evaluator, n, out / n, progress=_progress(a), force=a.force)
        except HetsimError as e:
            if a.schedulers:  # asked for by name: its error is the answer
                raise
            # the default is every registered scheduler; some cannot plan every problem
            # (bruteforce on a long model, exact without minimize: cost, ...)
            print(f"hetsim: skipped {n}: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        rows.append(_compare_row(result, plan, loaded.config.job))
    if not rows:
        raise HetsimError(f"{a.config}: no scheduler could plan this config")
    write_csv(out / "comparison.csv", rows)
    plots.comparison_chart(rows, out / "comparison.png", title=f"{loaded.config.name} ({a.evaluator})")
    if warning := runner.staleness_warning(rows):
        print(f"hetsim: warning: {warning}", file=sys.stderr)
    print_comparison(rows, COMPARE_COLS)
    print(f"wrote {out}/comparison.csv, comparison.png and one folder per scheduler")
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from experiments import plots, runner
    from hardware_profiles.fileio import prepare_out

    base = runner.load(DEFAULT_CONFIG)
    out = prepare_out(a.out)
    rows = []
    runs = [(m, s) for m in DEMO_MODELS for s in DEMO_SCHEDULERS]
    for model, sched in tqdm(runs, desc="demo", unit="run", disable=not _progress(a)):
        data = base.config.model_dump(mode="json")
        data["job"]["model"] = model
        data["name"] = f"demo-{model}"
        loaded = runner.from_dict(data, base.base_dir, str(DEFAULT_CONFIG))
        result, plan = runner.run_one(loaded, "des", sched, out / model / sched)
        rows.append(_compare_row(result, plan, loaded.config.job, model=model))
    write_csv(out / "comparison.csv", rows)
    plots.comparison_chart(rows, out / "comparison.png", title="hetsim demo: 1 V100 + 2 T4 + 4 CPU, 2 PS shards, 10 Gbps")
    from hardware_profiles.fileio import atomic_write

    atomic_write(out / "trace.json", (out / DEMO_MODELS[0] / DEMO_SCHEDULERS[-1] / "trace.json").read_bytes())
    if warning := runner.staleness_warning(rows):
        print(f"hetsim: warning: {warning}", file=sys.stderr)
    print_comparison(rows, ("model", *COMPARE_COLS))
    print(f"wrote {out}/: comparison.csv, comparison.png, trace.json (open in https://ui.perfetto.dev), "
          "and one folder per run")
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    from experiments import sweep
    from hardware_profiles.fileio import prepare_out

    sw = sweep.load_sweep(a.sweep)
    if not a.force:
        sw.check_size()  # before the output folder is made
    out = prepare_out(a.out or Path("results") / "sweeps" / Path(a.sweep).stem)
    try:
        table = sweep.run_sweep(sw, out, jobs=a.jobs, backend=a.backend, address=a.address,
                                progress=_progress(a), force=a.force)
    except sweep.SweepInterrupted as e:
        print(f"hetsim: interrupted: {e.done} points finished in this run, {e.remaining} not run; "
              f"{e.csv} is complete up to here: rerun the same command to resume", file=sys.stderr)
        return 130
    st = table.attrs["sweep"]
    ran = st["ok"] + st["error"]
    rate = f", {ran / st['wall_s']:.3g} points/s" if ran and st["wall_s"] > 0 else ""
    print(f"sweep {sw.name}: {st['points']} points: {st['ok']} ok, {st['error']} error, "
          f"{st['skipped']} skipped (already in results.csv); {st['wall_s']:.1f} s{rate}")
    print(f"wrote {st['csv']} ({len(table)} rows) and {out}/runs/POINT_ID/")
    failed = table.attrs["failed"]
    if failed and not a.allow_failures:
        earlier = len(failed) - st["error"]
        print(f"hetsim: {len(failed)} of {st['points']} points failed"
              + (f" ({earlier} in an earlier run)" if earlier else "")
              + f": status error in {st['csv']}, the reason in its error column; exit status "
              f"{SWEEP_FAILED} (--allow-failures: 0)", file=sys.stderr)
        return SWEEP_FAILED
    return 0


def cmd_plot(a: argparse.Namespace) -> int:
    from experiments.plot_dirs import folder_kind, plot_dir
    from hardware_profiles.fileio import prepare_out

    folder = Path(a.dir)
    out = prepare_out(a.out) if a.out and folder_kind(folder) else None
    paths = plot_dir(folder, out)
    for path in paths:
        print(f"wrote {path}")
    return 0


def _default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cmd_run(a: argparse.Namespace) -> int:
    from experiments import run as entry
    from hardware_profiles.fileio import prepare_out
    from runtime.launch import RuntimeFailure

    prep = entry.prepare(a.input, config=a.config, iterations=a.iterations, timeout_s=a.timeout,
                         scheduler=a.scheduler)
    writer = not entry.under_torchrun() or os.environ.get("RANK") == "0"
    out_dir = Path(a.out or Path("results") / prep.spec.name / "runtime")
    out = prepare_out(out_dir) if writer else None
    entry.attach_checkpoints(prep, out_dir, resume=a.resume, writer=writer)
    try:
        result = entry.execute(prep, out)
    except RuntimeFailure as e:
        print(f"hetsim: run failed: {e}{entry.resume_hint(prep)}", file=sys.stderr)
        return 1
    if result is not None:
        print_table([_row(result)], (*SUMMARY_COLS[:5], "energy_j"))
        for f in result.failures:
            print(f"failure: {f['worker']} detected at {f['detected_at_s']:.2f} s ({f['detected_by']})")
        print(f"wrote {out}/ (summary.json, iterations.csv, trace.json, plan.json, config.json)")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from experiments import validate
    from experiments.run import read_config
    from experiments.validate_headline import headline, headline_text
    from hardware_profiles.fileio import prepare_out
    from runtime.launch import RuntimeFailure

    cfg, runtime_raw = read_config(a.config)  # a bad config fails here, before --out is created
    out = prepare_out(a.out or Path("results") / cfg.name / "validate")
    step = None if a.quiet else lambda s: print(f"validate: {s}", file=sys.stderr)
    try:
        if a.fresh_profile:  # measured and its runtime CPU model fitted once, then reused
            from experiments.runtime_calibration import fresh_machine
            from runtime.spec import parse_options

            fresh_machine(Path(a.fresh_profile), parse_options(runtime_raw, str(a.config)).threads, step,
                          also=[Path(a.config)])
        v = validate.validate(a.config, a.schedulers, a.iterations, out, timeout_s=a.timeout,
                              on_step=step, fresh_profile=Path(a.fresh_profile) if a.fresh_profile else None,
                              repeats=a.repeat)
    except RuntimeFailure as e:
        print(f"hetsim: run failed: {e}", file=sys.stderr)
        return 1
    rows = [{"scheduler": r.scheduler, "metric": k, "sim": m["sim"], "real": m["real"],
             "error": validate.pct(m["rel_error"])} for r in v.runs for k, m in r.metrics.items()]
    print_table(rows, ("scheduler", "metric", "sim", "real", "error"))
    for r in v.runs:
        print(f"{r.scheduler} headline: {headline_text(headline(r.metrics, r.diagnostics))}")
        rc = r.diagnostics.get("runtime_cpu") or {}
        if rc.get("models"):
            first = rc["sim_without_model"]["iteration_time_mean_s"]
            real = r.metrics["iteration_time_mean_s"]["real"]
            print(f"{r.scheduler}: sim = the DES with the profile's runtime CPU model (network.runtime_cpu); "
                  f"without it {first:.4g} s a mean iteration ({validate.pct(validate.rel_error(first, real))})")
        if c := r.diagnostics.get("cpu_per_iteration"):
            print(f"{r.scheduler}: CPU per iteration, every process: {c['sim_total_ms']:.4g} ms simulated, "
                  f"{c['real_total_ms']:.4g} ms real ({validate.pct(validate.rel_error(c['sim_total_ms'], c['real_total_ms']))}"
                  f"); by process in report.md")
    if v.ranking_preserved is not None:
        print(f"ranking preserved: {'yes' if v.ranking_preserved else 'no'}")
    print(f"wrote {out}/ (report.md, validation.csv, validation.json, sim_vs_real.png, "
          "SCHEDULER/sim/ and SCHEDULER/real/)")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from experiments import des_bench
    from hardware_profiles.errors import ConfigError

    if a.repeat is not None and a.repeat < 1:
        raise ConfigError("<command line>", "--repeat", "must be at least 1")
    figures = des_bench.run_all(quick=a.quick, progress=not (a.json or a.quiet), repeat=a.repeat)
    if a.json:
        print(json.dumps(figures, indent=2))
    else:
        des_bench.print_report(figures)
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    from calibration import profiler
    from hardware_profiles.errors import ConfigError

    if a.add_micro is not None:
        ignored = [flag for flag, on in (("--suite robotics", a.suite == "robotics"), ("--quick", a.quick),
                                          ("--models", a.models is not None),
                                          ("--no-network", a.no_network), ("--compare", a.compare is not None),
                                          ("--rounds", a.rounds is not None))
                   if on]
        if ignored:
            raise ConfigError("<command line>", "--add-micro", f"does not combine with {ignored[0]}")
        names = [n for n in a.add_micro.split(",") if n]
        if not names:
            raise ConfigError("<command line>", "--add-micro", "names no benchmark (names, or 'missing')")
        if not a.out:
            raise ConfigError("<command line>", "--add-micro", "needs --out, the measured "
                              "profile to add the benchmarks to")
        prof, new = profiler.add_micro(a.out, names, device=a.device, threads=a.threads, progress=_progress(a))
        if not new:
            print(f"nothing to measure; {a.out} unchanged")
            return 0
        print(f"measured {', '.join(e['name'] for e in new)}; re-fitted")
        print(f"wrote {a.out}")
        return 0
    if a.suite == "robotics":
        from calibration import robotics_kernels

        path, text = robotics_kernels.run_profile(a.device or "cpu", a.out or robotics_kernels.DEFAULT_OUT,
                                                  quick=a.quick, threads=a.threads, compare=a.compare,
                                                  progress=_progress(a))
        print(text)
        print(f"wrote {path}")
        return 0
    models = [m for m in a.models.split(",") if m] if a.models else None
    prof, path = profiler.run_profile(a.device or "cpu", a.out or "hardware_profiles/measured/local.json",
                                      quick=a.quick, threads=a.threads,
                                      models=models, network=not a.no_network,
                                      progress=_progress(a), rounds=a.rounds)
    print(profiler.summary(prof))
    print(f"wrote {path}")
    return 0


def cmd_calibrate(a: argparse.Namespace) -> int:
    from calibration import calibrate
    from calibration.profiler import drift_line, write_profile
    from hardware_profiles import load_profile_file
    from hardware_profiles.errors import ConfigError
    from hardware_profiles.fileio import prepare_file_out
    from sim.limits import non_finite

    prof = load_profile_file(a.profile)
    raw = prof.measurement.raw
    if not raw or not (raw.get("models") or raw.get("micro") or raw.get("gpu")):
        raise ConfigError(a.profile, "measurement.raw", "no raw layer measurements to fit (make the "
                          "profile with hetsim profile)")
    if (bad := non_finite(raw)) is not None:
        raise ConfigError(a.profile, f"measurement.raw.{bad[0]}", f"{bad[1]} is not a finite number")
    out = prepare_file_out(a.out or a.profile)
    try:
        calibrate.cold_curves(raw)
    except ValueError as e:
        raise ConfigError(a.profile, "measurement.raw.cold", str(e).removeprefix("raw.cold").lstrip(".: ")) from None
    try:
        result = calibrate.calibrate(prof)
    except ValueError as e:
        if "gpu" not in raw:
            raise _malformed_raw(a.profile, e) from None
        # a GPU profile's fit names the raw entry it lacks: "raw.KEY: why"
        where, _, why = str(e).partition(": ")
        raise ConfigError(a.profile, f"measurement.{where}", why) from None
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise _malformed_raw(a.profile, e) from None
    print(calibrate.format_residuals(result.residuals))
    drift = calibrate.drift_of(raw)
    if drift is not None:
        print(drift_line(drift))
    if out.stem != prof.name:
        result = calibrate.CalibrationResult(result.profile.model_copy(update={"name": Path(out).stem}),
                                             result.residuals)
    write_profile(result.profile, out)
    print(f"wrote {out}")
    return 0


def _malformed_raw(profile: str, e: Exception) -> Exception:
    """The fit failing on a measured profile's raw section that is not what hetsim
    profile writes (an entry missing, a string for a mapping): the file is at fault
    (a ConfigError)."""
    from hardware_profiles.errors import ConfigError

    why = str(e).splitlines()[0] if str(e) else ""
    return ConfigError(profile, "measurement.raw", f"malformed raw measurements, not as hetsim "
                       f"profile writes them ({type(e).__name__}: {why})")


def cmd_train_rl(a: argparse.Namespace) -> int:
    from hardware_profiles.errors import ConfigError
    from schedulers.rl import train as rl_train

    if (a.config is None) == (not a.random):
        raise ConfigError("<command line>", "CONFIG", "give either a CONFIG (train on its problem) or "
                          "--random (train on random instances)")
    if a.fine_tune and a.random:
        raise ConfigError("<command line>", "--fine-tune", "fine-tuning needs a CONFIG, not --random")
    if not 0.0 <= a.real_share <= 1.0:
        raise ConfigError("<command line>", "--real-share", f"must lie in [0, 1], got {a.real_share:g}")
    if a.dagger_rounds < 0:
        raise ConfigError("<command line>", "--dagger-rounds", f"must be >= 0, got {a.dagger_rounds}")
    cfg = rl_train.TrainConfig(timesteps=a.timesteps, seed=a.seed, n_envs=a.n_envs, pool_size=a.pool_size,
                               bc_instances=a.bc_instances, max_wall_s=a.max_wall_s, real_share=a.real_share,
                               dagger_rounds=a.dagger_rounds)
    problem = None
    if a.config is not None:
        from experiments import runner

        problem = runner.problem_of(runner.load(a.config))
    init = a.init if a.init else (str(rl_train.default_policy()) if a.fine_tune else None)
    meta = rl_train.train(a.out, cfg, problem=problem, init=init, log_dir=a.log_dir, progress=_progress(a))
    print(f"trained {meta['timesteps']} timesteps in {meta['wall_s']:.0f} s ({meta['mode']})")
    if problem is not None:
        print(rl_train.compare_on(problem, a.out))
    print(f"wrote {a.out}, {Path(a.out).with_suffix('.json')} and {meta['log_dir']}/ (progress.csv, "
          "TensorBoard events)")
    return 0


# ------------------------------------------------------------------ parser
def _shows_default(action: argparse.Action) -> bool:
    """Whether help states the option's default: not for flags, nor for a None, an
    empty list or a suppressed one (0 is a default to state)."""
    d = action.default
    return not (d is None or d is False or d == [] or d == argparse.SUPPRESS)


class _Formatter(argparse.HelpFormatter):
    """Help that states each option's default: "(default: X)" is added to an option
    whose help does not already say it (none for flags and options without one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not action.option_strings or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with the house error convention: one line on stderr, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog.split()[0]} --help)\n")


def scheduler_names(kind: str = "training") -> str:
    """The scheduler names help lists: the built-ins of ``kind``. Plugins register
    when a verb runs (reading the entry points costs more than the rest of --help)."""
    return (", ".join(BUILTIN_SCHEDULERS[kind]) + f"; or one that an installed plugin (entry-point "
            f"group {ENTRY_POINT_GROUP}) or a --plugin module registers")


def _quiet(p: argparse.ArgumentParser, what: str = "no progress bar (off anyway when stderr is not a "
           "terminal)") -> None:
    p.add_argument("--quiet", action="store_true", help=what)


def _config_options(p: argparse.ArgumentParser, plans: bool = True) -> None:
    """--set on a verb that reads a config; --plugin on one that plans."""
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a field of the config, the value parsed as YAML "
                   "(job.iterations=5, cluster.devices.0.count=2, job.sync=asp); repeatable")
    if plans:
        p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import MODULE (from the working directory or the Python path) "
                       "before the scheduler is looked up, so that the schedulers it "
                       "registers (@hetsim.register_scheduler) can be named; repeatable")


def _progress(a: argparse.Namespace) -> bool:
    """Whether to draw progress bars: not with --quiet, nor when stderr is no terminal."""
    return not getattr(a, "quiet", False) and sys.stderr.isatty()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hetsim", description=__doc__.splitlines()[0] if __doc__ else None)
    from hetsim import __version__

    p.add_argument("--version", action="version", version=f"hetsim {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    training, dag = scheduler_names("training"), scheduler_names("dag")

    d = sub.add_parser("demo", help="run the default experiment (no arguments needed)")
    d.add_argument("--out", default="results/demo", help="output folder (default results/demo)")
    _quiet(d)
    _config_options(d, plans=False)
    d.set_defaults(fn=cmd_demo)

    s = sub.add_parser("simulate", help="simulate one config")
    s.add_argument("config", help="a config (YAML)")
    s.add_argument("--evaluator", choices=EVALUATORS, default="des",
                   help="des: the discrete-event simulation; analytic: the closed-form model")
    s.add_argument("--scheduler", help=f"override the config's scheduler: {training}")
    s.add_argument("--plan", help="evaluate this plan.json instead of planning (e.g. one edited by hand)")
    s.add_argument("--out", help="output folder (default results/NAME/EVALUATOR)")
    _quiet(s)
    _config_options(s)
    s.add_argument("--force", action="store_true", help=FORCE_HELP)
    s.set_defaults(fn=cmd_simulate)

    pl = sub.add_parser("plan", help="print or save the plan a scheduler makes")
    pl.add_argument("config", help="a config (YAML)")
    pl.add_argument("--scheduler", help=f"override the config's scheduler: {training}")
    pl.add_argument("--out", help="plan.json path (default: stdout)")
    _config_options(pl)
    pl.add_argument("--force", action="store_true", help=FORCE_HELP)
    pl.set_defaults(fn=cmd_plan)

    c = sub.add_parser("compare", help="compare schedulers on one config")
    c.add_argument("config", help="a config (YAML)")
    c.add_argument("--schedulers", help=f"comma-separated names (default: all registered): {training}")
    c.add_argument("--evaluator", choices=EVALUATORS, default="des",
                   help="des: the discrete-event simulation; analytic: the closed-form model")
    c.add_argument("--out", help="output folder (default results/NAME/compare)")
    _quiet(c)
    _config_options(c)
    c.add_argument("--force", action="store_true", help=FORCE_HELP)
    c.set_defaults(fn=cmd_compare)

    dg = sub.add_parser("dag", help="schedule a periodic robotics pipeline on an embedded board and "
                        "simulate its frames")
    dg.add_argument("config", help="a robotics config (format: sim/dag_config.py, docs/guides/robotics.md)")
    dg.add_argument("--schedulers", help=f"comma-separated DAG schedulers (default: the config's): {dag}")
    dg.add_argument("--out", help="output folder (default results/CONFIG/dag)")
    _config_options(dg)
    dg.add_argument("--force", action="store_true", help="simulate even beyond the size limit of "
                    "des.frames x tasks (sim/limits.py), otherwise refused up front")
    dg.set_defaults(fn=cmd_dag)

    sw = sub.add_parser("sweep", help="run a sweep file's points in parallel (resumable)")
    sw.add_argument("sweep", help="sweep file (YAML)")
    sw.add_argument("--jobs", type=int, default=_default_jobs(),
                    help="worker processes (default: the CPUs available)")
    sw.add_argument("--out", help="output folder (default results/sweeps/SWEEP_STEM)")
    sw.add_argument("--backend", choices=BACKENDS, default="local",
                    help="local process pool (default) or a dask.distributed cluster")
    sw.add_argument("--address", help="dask scheduler address, e.g. tcp://10.0.0.1:8786 "
                    "(default: a LocalCluster of --jobs workers on 127.0.0.1)")
    _quiet(sw)
    sw.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                    help="import MODULE (from the working directory or the Python path) first, so "
                    "that the points can name the schedulers it registers (local backend: the "
                    "workers inherit it); repeatable")
    sw.add_argument("--allow-failures", action="store_true",
                    help=f"exit 0 when points failed (default: exit {SWEEP_FAILED} after writing every row)")
    sw.add_argument("--force", action="store_true",
                    help=f"run a sweep of more than {MAX_POINTS} points (refused by default: every point "
                    "is held in memory before the first runs)")
    sw.set_defaults(fn=cmd_sweep)

    pt = sub.add_parser("plot", help="the figures that fit an output folder (sweep, compare, demo, "
                        "simulate, run, dag, validate)")
    pt.add_argument("dir", help="an output folder of hetsim sweep, compare, demo, simulate, run, dag or validate")
    pt.add_argument("--out", help="figure folder (default DIR/figures)")
    pt.set_defaults(fn=cmd_plot)

    pr = sub.add_parser("profile", help="measure this machine's CPU or a GPU into a device profile")
    pr.add_argument("--device", help="cpu (default; with --add-micro: the profile's) or cuda:N")
    pr.add_argument("--suite", choices=("models", "robotics"), default="models",
                    help="models (default): the device profile (GEMMs, layers, zoo models, "
                    "network); robotics: the sim.robotics kernels' times, with the cost model's "
                    "prediction beside them")
    pr.add_argument("--out", help="profile file; its name is the file stem (default "
                    "hardware_profiles/measured/local.json; robotics: "
                    "hardware_profiles/measured/robotics/local.json)")
    pr.add_argument("--compare", help="robotics suite: the device profile to predict with "
                    "(default this_machine on a CPU, none on a GPU)")
    pr.add_argument("--quick", action="store_true", help="small sizes, a few minutes on 2 CPU cores")
    pr.add_argument("--threads", type=int, help="torch threads (default: the CPUs available); "
                    "with 1, CPU times are the thread's CPU time")
    pr.add_argument("--models", help="comma-separated zoo models to time (default: all)")
    pr.add_argument("--rounds", type=int,
                    help="take every benchmark's repeats in N interleaved rounds, so that each "
                    "one samples the whole run, and keep a low percentile of them (default 8; "
                    "--quick 1; 1: back to back, the median)")
    pr.add_argument("--no-network", action="store_true", help="skip the two-process network benchmark")
    _quiet(pr)
    pr.add_argument("--add-micro", metavar="NAMES", help="comma-separated single-layer "
                    "benchmarks of the grid, the extras measured only on request "
                    "(linear_{256x256,1024x1024,4096x1024,512x4096}_b16: batches 16 and 32), "
                    "or 'cold' (the cold-call benchmark of a CPU "
                    "profile) ('missing': those of the grid and cold the profile lacks) to measure "
                    "alone, with the settings of the measured profile --out, on the machine "
                    "that measured it; merged into its raw data, which is then re-fitted")
    pr.set_defaults(fn=cmd_profile)

    ca = sub.add_parser("calibrate", help="fit a measured profile's efficiency curves; print the residuals")
    ca.add_argument("profile", help="a profile written by hetsim profile")
    ca.add_argument("--out", help="write the calibrated profile here (default: in place)")
    ca.set_defaults(fn=cmd_calibrate)

    tr = sub.add_parser("train-rl", help="train the rl placement policy (MaskablePPO)")
    tr.add_argument("config", nargs="?", help="train on this config's problem (per-instance, as HeterPS)")
    tr.add_argument("--random", action="store_true",
                    help="train on random instances instead (one policy for unseen models and clusters)")
    tr.add_argument("--fine-tune", action="store_true",
                    help="start from --init (default: the shipped policy) instead of from scratch")
    tr.add_argument("--init", help="policy file to start from")
    tr.add_argument("--timesteps", type=int, default=200_000, help="PPO environment steps (default 200000)")
    tr.add_argument("--out", default="results/rl/policy.zip", help="policy file (default results/rl/policy.zip)")
    tr.add_argument("--log-dir", help="progress.csv and TensorBoard events (default: OUT_STEM_logs/)")
    tr.add_argument("--seed", type=int, default=0, help="random seed of the instances and of PPO")
    tr.add_argument("--n-envs", type=int, default=8, help="environments per rollout (default 8)")
    tr.add_argument("--pool-size", type=int, default=6000,
                    help="random instances drawn for --random training (default 6000)")
    tr.add_argument("--bc-instances", type=int, default=6000,
                    help="warm start: imitate the exact optimum on this many instances before PPO "
                    "(0: pure PPO; default 6000; not with --fine-tune)")
    tr.add_argument("--real-share", type=float, default=0.0,
                    help="share of the --random pool that is real-model instances (zoo models and "
                    "generated families at real depth, schedulers/rl/workloads.py; default 0)")
    tr.add_argument("--dagger-rounds", type=int, default=0,
                    help="after the warm start, rounds of DAgger: the exact solver labels states the "
                    "policy reaches (default 0)")
    tr.add_argument("--max-wall-s", type=float, help="stop PPO once the run has taken this many seconds")
    _quiet(tr)
    _config_options(tr, plans=False)
    tr.set_defaults(fn=cmd_train_rl)

    ru = sub.add_parser("run", help="execute a plan for real (torch.distributed PS shards and workers)")
    ru.add_argument("input", metavar="PLAN_OR_CONFIG", help="a config (YAML) or a plan.json (with --config)")
    ru.add_argument("--config", help="with a plan.json: the config of its cluster and job")
    ru.add_argument("--scheduler", help=f"override the config's scheduler: {training}")
    ru.add_argument("--out", help="output folder (default results/NAME/runtime)")
    ru.add_argument("--iterations", type=int, help="override job.iterations")
    ru.add_argument("--timeout", type=_positive_seconds, default=600.0,
                    help="wall-clock limit of the whole run in seconds (default 600)")
    ru.add_argument("--resume", action="store_true",
                    help="continue from the last complete checkpoint in OUT/checkpoint "
                         "(runtime.checkpoint_every), with the same config")
    _config_options(ru)
    ru.set_defaults(fn=cmd_run)

    va = sub.add_parser("validate", help="simulate (calibrated DES) and run for real the same plans; "
                        "report sim vs real per metric")
    va.add_argument("config", help="a config, with a runtime: section for the real run")
    va.add_argument("--schedulers", help=f"comma-separated names (default: the config's scheduler): {training}")
    va.add_argument("--iterations", type=int, help="override job.iterations on both sides")
    va.add_argument("--timeout", type=_positive_seconds, default=600.0,
                    help="wall-clock limit of each real run in seconds (default 600)")
    va.add_argument("--out", help="output folder (default results/NAME/validate)")
    va.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the real side N times and compare with the run of median mean iteration "
                         "time (default 1)")
    va.add_argument("--fresh-profile", metavar="FILE",
                    help="price every rank with this machine's profile instead of the config's: "
                         "measured now into FILE with its runtime CPU model (at most about 5 minutes), "
                         "or FILE reused where it exists")
    _quiet(va, "no progress lines")
    _config_options(va)
    va.set_defaults(fn=cmd_validate)

    b = sub.add_parser("bench", help="DES speed and scale benchmark")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")
    b.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    b.add_argument("--repeat", type=int, default=None,
                   help="measure the ratio N times, each DES run right after its SimPy loop, and "
                   "report the median, the lower middle one for an even N (default 5; 1 with --quick)")
    _quiet(b, "no progress lines")
    b.set_defaults(fn=cmd_bench)
    return p


def _stdout_gone() -> bool:
    """Whether stdout's reader went away (`hetsim ... | head`): its pipe reports an error
    (POLLERR or POLLHUP: no reader left; without poll, as on Windows, assumed). Then stdout is pointed at /dev/null, so that Python's
    flush at exit does not fail again, and the command ends quietly, as other
    command-line tools do."""
    try:
        out = sys.stdout.fileno()
    except (OSError, ValueError):  # a stdout without a file descriptor (captured)
        return False
    if hasattr(select, "poll"):  # (POLLHUP: what some systems report instead)
        poller = select.poll()
        poller.register(out, select.POLLOUT)
        if not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
            return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, out)
    finally:
        os.close(devnull)
    return True


def _config_paths(a: argparse.Namespace) -> list[str | Path]:
    """The config files a verb reads, which its --set overrides apply to."""
    if a.cmd == "demo":
        return [DEFAULT_CONFIG]
    return [p for p in (getattr(a, "input", None), getattr(a, "config", None)) if p]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hardware_profiles.errors import HetsimError
    from sim.overrides import overriding

    try:
        if getattr(args, "plugin", None):
            import schedulers

            for module in args.plugin:
                schedulers.import_plugin(module)
        with overriding(_config_paths(args), getattr(args, "set", None) or []):
            rc = int(args.fn(args))
        sys.stdout.flush()  # here, not at exit, so that a reader gone away is caught below
        return rc
    except HetsimError as e:
        print(f"hetsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe or socket broke: not the reader's doing
        return 141


if __name__ == "__main__":
    sys.exit(main())
