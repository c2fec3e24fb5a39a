"""The validation suite: `hetsim validate` over experiments/configs/validation/.

    python -m bench.validation_suite [--out results/validation_suite] [--only v1,v3] [--iterations N]
        [--fresh-profile FILE] [--repeat N]
    python -m bench.validation_suite --resimulate results/validation_suite/suite.json --out DIR [--only v1,v3]
    python -m bench.validation_suite --rescore SUITE_DIR --out DIR [--fresh-profile FILE]

Each config is planned, simulated with the DES (the measured single-thread
profile ``this_machine``) and run for real; the suite then reports the error
of the mean iteration time per (config, scheduler), its median absolute value
over all of them and separately over the configs whose worker threads fit the
machine's cores and those that oversubscribe them, and
whether each multi-scheduler config keeps its ranking. The DES runs with this
machine as a host (``cluster.hosts``, filled in by ``hetsim validate``: its
cores and the background load sampled before each run, every rank a process
on it), and the suite also reports what the DES predicted without it (every
device computing on its own, as before hosts existed). Where the profile has a
runtime CPU model (``network.runtime_cpu``, fitted by ``python -m
bench.runtime_calibration`` on other configs), the simulated side is the DES
with each process's CPU predicted by it, and the suite also reports the DES
without it. Beside the mean iteration time, the headline gives the median |error|
over every per-worker compute and communication metric, which calibrated models of
this machine the DES used and its error without them
(:mod:`experiments.validate_headline`). ``--fresh-profile FILE`` prices every rank
with this machine's profile measured once into FILE (reused when it exists; see
:mod:`calibration.fresh_profile`) instead of ``this_machine``. Writes OUT/report.md
(the suite table, then every metric of every run), OUT/validation.csv,
OUT/validation.json, OUT/sim_vs_real.png and OUT/CONFIG/SCHEDULER/{sim,real}/.

Each real side runs ``--repeat`` times (default 3) and the run of median mean
iteration time is compared: on a shared machine one run's mean iteration moves by
10-50% from one run to the next (the report gives the spread measured).

``--rescore SUITE_DIR`` runs nothing real: the simulated side of every recorded
SUITE_DIR/CONFIG/validation.json again with the DES as the code is now
(:func:`experiments.validate.rescore`), against the recorded real side, for
working on the DES.

``--resimulate SUITE_JSON`` runs nothing real: each row of that suite.json is simulated
again (the DES side of ``hetsim validate``, :func:`experiments.validate.resimulate_figures`)
on a host of the row's cores and recorded background threads, into OUT/resimulated.csv
beside the recorded sim_s; on the code that wrote the suite they are equal.

Target (issue 6): median absolute error of the mean iteration time <= 10%
on this CPU machine, ranking preserved.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments import validate, validate_headline
from experiments.plots import markdown_table
from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "experiments" / "configs" / "validation"
#: Schedulers compared per config (default: the config's own scheduler).
SCHEDULERS = {"v3_mlp_2w_slow": "equal,hps", "v8_wide_deep_4w_slow": "equal,hps"}


def suite_rows(results: Sequence[validate.Validation]) -> list[dict[str, Any]]:
    """One row per (config, scheduler): the mean-iteration-time comparison and the host load."""
    rows = []
    for v in results:
        for r in v.runs:
            m = r.metrics["iteration_time_mean_s"]
            rows.append({"config": v.name, "scheduler": r.scheduler, "workers": v.info.get("workers"),
                         "worker threads / cores": f"{v.info.get('worker_threads')}/{v.info.get('cores')}",
                         "sim_s": m["sim"], "real_s": m["real"],
                         "error": validate.pct(m["rel_error"]),
                         "sim w/o CPU model": (nm := _without_model(r)),
                         "error w/o CPU model": validate.pct(validate.rel_error(nm, m["real"])),
                         "sim w/o host": (nh := r.diagnostics.get("sim_without_host", {})
                                              .get("iteration_time_mean_s")),
                         "error w/o host": validate.pct(validate.rel_error(nh, m["real"])),
                         "sim w/o copies": (nc := r.diagnostics.get("sim_without_copies", {})
                                            .get("iteration_time_mean_s")),
                         "error w/o copies": validate.pct(validate.rel_error(nc, m["real"])),
                         "background threads": r.diagnostics.get("host", {}).get("background_threads"),
                         "ranking preserved": ("-" if v.ranking_preserved is None
                                               else "yes" if v.ranking_preserved else "NO"),
                         "load avg": r.diagnostics.get("loadavg_1min", [None])[0]})
    return rows


def _without_model(r: validate.SchedulerRun) -> float | None:
    """The DES's mean iteration before the runtime CPU model (None: the run used none)."""
    rc = r.diagnostics.get("runtime_cpu") or {}
    return rc["sim_without_model"]["iteration_time_mean_s"] if rc.get("models") else None


def _mean_over_workers(metrics: dict[str, dict[str, float | None]], kind: str, side: str) -> float | None:
    vals = [x for k, m in metrics.items() if k.startswith(kind + ":") and (x := m[side]) is not None]
    return sum(vals) / len(vals) if vals else None


def _ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def _rest(it: float | None, compute: float | None, comm: float | None) -> float | None:
    """The iteration less compute and transfers (overlaps make it smaller, not wrong)."""
    return None if it is None or compute is None or comm is None else it - compute - comm


def decomposition_rows(results: Sequence[validate.Validation]) -> list[dict[str, Any]]:
    """Where the error comes from, per (config, scheduler), in ms per measured iteration
    (means over workers): compute as simulated, as measured alone in one process with one
    thread (CPU time: the cost model's own error, without contention), and in the run (wall:
    with the other ranks and the machine's other jobs on the cores); the same for transfers;
    the rest of the iteration (barrier waits, the PS's turn on a core, wake-ups); and the DES
    rerun with each worker's compute scaled to the real one (what is left is transfers,
    PS work and waits)."""
    rows = []
    for v in results:
        for r in v.runs:
            m = r.metrics
            alone = r.diagnostics.get("standalone_compute_s", {})
            shares = r.diagnostics.get("shares", {})
            cpu = [alone[str(b)]["cpu_s"] for b in shares.values() if str(b) in alone]
            wall = [alone[str(b)]["wall_s"] for b in shares.values() if str(b) in alone]
            c_sim, c_real = _mean_over_workers(m, "compute_s", "sim"), _mean_over_workers(m, "compute_s", "real")
            x_sim, x_real = _mean_over_workers(m, "comm_s", "sim"), _mean_over_workers(m, "comm_s", "real")
            it_sim, it_real = m["iteration_time_mean_s"]["sim"], m["iteration_time_mean_s"]["real"]
            oracle = r.diagnostics.get("sim_with_real_compute", {}).get("iteration_time_mean_s")

            rows.append({
                "config": v.name, "scheduler": r.scheduler,
                "iter sim": _ms(it_sim), "iter real": _ms(it_real),
                "compute sim": _ms(c_sim), "compute alone (CPU)": _ms(sum(cpu) / len(cpu)) if cpu else None,
                "alone wall/CPU": (sum(wall) / sum(cpu)) if cpu and sum(cpu) > 0 else None,
                "compute real": _ms(c_real), "comm sim": _ms(x_sim), "comm real": _ms(x_real),
                "rest sim": _ms(_rest(it_sim, c_sim, x_sim)), "rest real": _ms(_rest(it_real, c_real, x_real)),
                "iter sim, real compute": _ms(oracle),
                "its error": validate.pct(validate.rel_error(oracle, it_real)),
            })
    return rows


CPU_ROWS_TEXT = (
    "CPU per iteration, every process together (ms), simulated and real, and how many cores "
    "were busy on the mean; the workers' and the shards' parts; the real workers' main threads "
    "in forward and backward; the DES rerun with each rank's CPU scaled to what it used in the "
    "real run, and, as a control, the real CPU divided by the cores the DES kept busy (no rerun).")


def cpu_rows(results: Sequence[validate.Validation]) -> list[dict[str, Any]]:
    """One row per (config, scheduler): :data:`CPU_ROWS_TEXT`, from
    :func:`experiments.validate.cpu_per_iteration` and the ``sim_with_real_cpu`` rerun
    (:func:`experiments.validate.with_cpu_scaled`)."""
    rows = []
    for v in results:
        for r in v.runs:
            c = r.diagnostics.get("cpu_per_iteration")
            if not c:
                continue
            ps = c["processes"]

            def part(role: str, side: str, ps: dict[str, Any] = ps) -> float:
                """The CPU of the placed processes in ``role``: a simulated one's transport is
                apart, a real one's total has its transport threads in it."""
                return sum(p[f"{side}_ms"] + (p["sim_transport_ms"] if side == "sim" else 0.0)
                           for p in ps.values() if p["role"] == role and p["sim_ms"] is not None)

            workers = [k for k, p in ps.items() if p["role"] == "worker"]
            comp = [x for k in workers if (x := ps[k]["real_compute_ms"]) is not None]
            rows.append({"config": v.name, "scheduler": r.scheduler,
                         "CPU sim": c["sim_total_ms"], "CPU real": c["real_total_ms"],
                         "error": validate.pct(validate.rel_error(c["sim_total_ms"], c["real_total_ms"])),
                         "workers sim": part("worker", "sim"), "workers real": part("worker", "real"),
                         "shards sim": part("ps", "sim"), "shards real": part("ps", "real"),
                         "fwd+bwd real": sum(comp) if comp else None,
                         "cores busy sim": c["sim_cores_busy"], "cores busy real": c["real_cores_busy"],
                         "iter sim, real CPU": _ms(oracle := r.diagnostics.get("sim_with_real_cpu", {})
                                                   .get("iteration_time_mean_s")),
                         "error, real CPU": validate.pct(validate.rel_error(
                             oracle, r.metrics["iteration_time_mean_s"]["real"])),
                         "real CPU / sim cores busy": _ms(control := validate.cpu_control_s(c)),
                         "error, control": validate.pct(validate.rel_error(
                             control, r.metrics["iteration_time_mean_s"]["real"]))})
    return rows


def summary_lines(results: Sequence[validate.Validation]) -> list[str]:
    """Median absolute errors of the mean iteration time, then over every per-worker compute
    and communication metric and without the calibrated models
    (:func:`experiments.validate_headline.suite_lines`), then of the DES's variants, of the
    configs fitting the cores and oversubscribing them, and ranking counts."""
    def med(vs: list[validate.Validation]) -> str:
        errs = [abs(e) for v in vs for r in v.runs
                if (e := r.metrics["iteration_time_mean_s"]["rel_error"]) is not None]
        return f"{100 * statistics.median(errs):.1f}% over {len(errs)} runs" if errs else "-"

    def med_of(vs: list[validate.Validation], estimate: Callable[[validate.SchedulerRun], float | None]) -> str:
        """The median |error| of another estimate of each run's mean iteration, on the same real runs."""
        errs = [abs(e) for v in vs for r in v.runs
                if (e := validate.rel_error(estimate(r), r.metrics["iteration_time_mean_s"]["real"])) is not None]
        return f"{100 * statistics.median(errs):.1f}%" if errs else "-"

    def med_diag(vs: list[validate.Validation], key: str) -> str:
        """... of the DES variant ``diagnostics[key]``."""
        return med_of(vs, lambda r: r.diagnostics.get(key, {}).get("iteration_time_mean_s"))

    def med_naive(vs: list[validate.Validation]) -> str:
        """... of the control :func:`experiments.validate.cpu_control_s`."""
        return med_of(vs, lambda r: validate.cpu_control_s(r.diagnostics.get("cpu_per_iteration")))

    fit = [v for v in results if not v.info.get("oversubscribed")]
    over = [v for v in results if v.info.get("oversubscribed")]
    ranked = [v for v in results if v.ranking_preserved is not None]
    kept = sum(1 for v in ranked if v.ranking_preserved)
    return [f"- median |error| of the mean iteration time: {med(list(results))}",
            *validate_headline.suite_lines((r.metrics, r.diagnostics) for v in results for r in v.runs),
            f"- the mean iteration time's median |error| "
            f"on the same real runs: the DES without the runtime CPU model {med_of(list(results), _without_model)}, "
            f"without the host {med_diag(list(results), 'sim_without_host')}, "
            f"with the host but messages free of CPU {med_diag(list(results), 'sim_without_copies')}; "
            f"diagnostics: given each worker's real compute {med_diag(list(results), 'sim_with_real_compute')}, "
            f"each rank's real CPU {med_diag(list(results), 'sim_with_real_cpu')}; control: the real CPU over "
            f"the cores the DES kept busy {med_naive(list(results))}",
            f"- worker threads <= cores: {med(fit)}; more worker threads than cores: {med(over)}",
            real_spread_line(results),
            f"- ranking preserved: {kept} of {len(ranked)} multi-scheduler configs"]


def real_spread_line(results: Sequence[validate.Validation]) -> str:
    """The real side's own noise: per run repeated (``diagnostics.real_repeats``), the spread
    of its repeats' mean iteration times (largest / smallest - 1), the median and largest."""
    spreads = [max(xs) / min(xs) - 1 for v in results for r in v.runs
               if len(xs := r.diagnostics.get("real_repeats", {}).get("iteration_time_mean_s") or []) > 1
               and min(xs) > 0]
    if not spreads:
        return "- the real side ran once a run (no repeats: its own noise is not measured)"
    return (f"- the real side's own noise, each run repeated and the median repeat compared: the spread "
            f"(largest / smallest mean iteration - 1) of its repeats, median {100 * statistics.median(spreads):.1f}%, "
            f"largest {100 * max(spreads):.1f}% over {len(spreads)} runs")


def resimulate_rows(suite_json: Path, configs: Sequence[Path], iterations: int | None = None
                    ) -> list[dict[str, Any]]:
    """Each row of a suite.json (its ``rows``) whose config is among ``configs``, simulated
    again without the real run (:func:`experiments.validate.resimulate_figures`) on a host
    of the row's cores and recorded background threads: the recorded and the new simulated
    mean iteration time, and the new figures without the CPU model, host and copies.

    Raises:
        ConfigError: suite.json unreadable, or a row without the fields needed (one line).
    """
    from sim.cluster import Host

    try:
        rows = json.loads(suite_json.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(str(suite_json), "rows", f"no suite rows to re-simulate ({type(e).__name__}: {e})") from None
    by_stem = {c.stem: c for c in configs}
    out = []
    for i, row in enumerate(rows):
        try:
            config = by_stem.get(row["config"])
            if config is None:
                continue
            cores = int(str(row["worker threads / cores"]).split("/")[1])
            host = Host("local", cores, float(row["background threads"]))
            scheduler = str(row["scheduler"])
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ConfigError(str(suite_json), f"rows[{i}]", f"cannot re-simulate this row ({type(e).__name__}: {e})") from None
        got = validate.resimulate_figures(config, scheduler, host, iterations)
        out.append({"config": row["config"], "scheduler": scheduler, "cores": cores,
                    "background threads": host.background_threads, "recorded sim_s": row.get("sim_s"),
                    "sim_s": got["sim"], "sim w/o CPU model": got["sim_without_model"],
                    "sim w/o host": got["sim_without_host"], "sim w/o copies": got["sim_without_copies"]})
    return out


def resimulate_main(suite_json: Path, configs: Sequence[Path], out: Path, iterations: int | None) -> int:
    """``--resimulate``: write OUT/resimulated.csv and print it with how many rows match."""
    import pandas as pd

    rows = resimulate_rows(suite_json, configs, iterations)
    if not rows:
        raise ConfigError(str(suite_json), "rows", "no row of the selected configs")
    out.mkdir(parents=True, exist_ok=True)
    with (out / "resimulated.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    print(markdown_table(pd.DataFrame(rows)))
    same = sum(1 for r in rows if r["sim_s"] == r["recorded sim_s"])
    print(f"{same} of {len(rows)} rows give the recorded sim_s again exactly")
    print(f"wrote {out / 'resimulated.csv'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.validation_suite", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/validation_suite",
                    help="where the report and each config's runs go (default: results/validation_suite, "
                         "the committed suite's folder)")
    ap.add_argument("--only", help="comma-separated config stems or prefixes (default: all)")
    ap.add_argument("--iterations", type=int, help="override job.iterations of every config")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--repeat", type=int, default=3, metavar="N",
                    help="run each real side N times and compare with the run of median mean iteration "
                         "time (default 3: one run's noise on a shared machine is 10-50%%)")
    ap.add_argument("--fresh-profile", metavar="FILE", type=Path,
                    help="price every rank with this machine's profile: measured into FILE once "
                         "(hetsim validate --fresh-profile), reused by every config")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the reports from OUT/*/validation.json without running anything")
    ap.add_argument("--resimulate", metavar="SUITE_JSON", type=Path,
                    help="no real runs: simulate each row of this suite.json again (the DES side "
                         "only, on a host of the row's cores and recorded background threads) and "
                         "write OUT/resimulated.csv with the recorded and the new sim_s "
                         "(e.g. --resimulate results/validation_suite/suite.json --out /tmp/resim)")
    ap.add_argument("--rescore", metavar="SUITE_DIR", type=Path,
                    help="no real runs: the simulated side of every SUITE_DIR/CONFIG/validation.json again "
                         "(the DES as the code is now, the recorded host and background load; with "
                         "--fresh-profile FILE priced with that profile), against the recorded real side; "
                         "writes the reports to OUT")
    a = ap.parse_args(argv)
    from tqdm import tqdm

    configs = sorted(CONFIG_DIR.glob("*.yaml"))
    if Path.cwd().resolve() == ROOT:  # run from the repository: reports name configs from it
        configs = [c.relative_to(ROOT) for c in configs]
    if a.only:
        keys = [k for k in a.only.split(",") if k]
        configs = [c for c in configs if any(c.stem == k or c.stem.startswith(k + "_") for k in keys)]
    if not configs:
        print(f"no configs matched in {CONFIG_DIR}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if a.resimulate is not None:
        try:
            return resimulate_main(a.resimulate, configs, out, a.iterations)
        except ConfigError as e:
            print(f"python -m bench.validation_suite: error: {e}", file=sys.stderr)
            return 2
    results = []
    t0 = time.monotonic()
    steps = sum(len(SCHEDULERS.get(c.stem, "x").split(",")) * 2 for c in configs)
    if a.report_only or a.rescore is not None:
        src = out if a.rescore is None else a.rescore
        results = [validate.Validation.from_json(json.loads((src / c.stem / "validation.json").read_text()))
                   for c in configs if (src / c.stem / "validation.json").is_file()]
        if not results:
            print(f"python -m bench.validation_suite: error: {src}: no CONFIG/validation.json of the "
                  "suite's configs there (give a folder a suite wrote)", file=sys.stderr)
            return 2
        if a.rescore is not None:
            profile = None
            if a.fresh_profile is not None:
                try:
                    profile = load_profile_file(a.fresh_profile)
                except ConfigError as e:
                    print(f"python -m bench.validation_suite: error: {e}", file=sys.stderr)
                    return 2
            results = [validate.rescore(v, profile) for v in tqdm(results, desc="rescore", disable=a.quiet or None)]
            for v in results:
                validate.write_files(out / Path(v.config).stem, [v])
        configs = []
    if configs and a.fresh_profile is not None:  # measured and its runtime CPU model fitted once
        from experiments.run import read_config
        from experiments.runtime_calibration import fresh_machine
        from runtime.spec import parse_options

        try:
            fresh_machine(a.fresh_profile, parse_options(read_config(configs[0])[1], str(configs[0])).threads,
                          None if a.quiet else lambda s: print(f"fresh profile: {s}", file=sys.stderr))
        except ConfigError as e:
            print(f"python -m bench.validation_suite: error: {e}", file=sys.stderr)
            return 2
    with tqdm(total=steps, desc="validation suite", unit="step", disable=a.quiet or None) as bar:
        for c in configs:
            def step(label: str, c: Path = c) -> None:
                bar.set_postfix_str(f"{c.stem} {label}")
                bar.update(1)

            try:
                results.append(validate.validate(c, SCHEDULERS.get(c.stem), a.iterations, out / c.stem,
                                                 on_step=step, fresh_profile=a.fresh_profile, repeats=a.repeat))
            except ConfigError as e:
                print(f"python -m bench.validation_suite: error: {e}", file=sys.stderr)
                return 2
    wall: float | None = time.monotonic() - t0
    if a.report_only:  # nothing ran: keep the runs' own wall time (None where unknown)
        old = out / "suite.json"
        wall = json.loads(old.read_text()).get("wall_s") if old.is_file() else None
    validate.write_files(out, results, title="hetsim validation suite")
    import pandas as pd

    table = markdown_table(pd.DataFrame(suite_rows(results)))
    decomp = markdown_table(pd.DataFrame(decomposition_rows(results)))
    cpu = cpu_rows(results)
    cpu_table = markdown_table(pd.DataFrame(cpu)) if cpu else "(no CPU figures in these runs)"
    lines = summary_lines(results)
    took = "" if wall is None else f", {wall:.0f} s"
    how = "".join([f" --rescore {a.rescore}" if a.rescore is not None else "",
                   f" --fresh-profile {a.fresh_profile}" if a.fresh_profile is not None else "",
                   f" --repeat {a.repeat}" if a.rescore is None and not a.report_only else ""])
    head = ["# hetsim validation suite", "", f"`python -m bench.validation_suite{how}`: {len(results)} configs"
            f"{took}.", "", *lines, "", table, "", "## Where the time goes (ms per iteration, "
            "mean over workers)", "", decomposition_rows.__doc__.split("\n\n")[0].replace("\n    ", " ")
            if decomposition_rows.__doc__ else "", "", decomp, "", "## Where the CPU goes (ms per iteration)", "",
            CPU_ROWS_TEXT, "", cpu_table, ""]
    body = (out / "report.md").read_text().split("\n", 2)[2]  # every metric, under the suite table
    (out / "report.md").write_text("\n".join(head) + body)
    (out / "suite.json").write_text(json.dumps({"wall_s": wall, "summary": lines, "rows": suite_rows(results),
                                                 "decomposition": decomposition_rows(results),
                                                 "cpu": cpu}, indent=2) + "\n")
    print(table)
    print()
    print(decomp)
    print()
    print(cpu_table)
    print("\n".join(lines))
    print(f"wrote {out}/ (report.md, validation.csv, validation.json, sim_vs_real.png, one folder per config)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
