"""``hetsim dag CONFIG``: plan a robotics pipeline with DAG schedulers and run the frames DES.

The schedulers plan with execution times scaled by the DES's load and jitter
(:func:`sim.dag.planning_costs`); the plan is then retimed with the nominal times
(plan.json, ``plan_frame_ms``) and run in the frames DES, which applies those
effects and memory contention. A plan whose DES miss rate exceeds the config's
``miss_tolerance`` is flagged (``des_miss_ok`` false, one warning on stderr).

For each scheduler, ``OUT/<scheduler>/`` gets plan.json (kind "dag", units,
start times, power mode), summary.json (the plan's figures, the run's headline
as for every plan kind, and the DES's frame figures under "des"), frames.csv
(one row per frame), trace.json (the first TRACE_FRAMES frames, Chrome trace
format) and gantt.png. ``OUT`` gets config.json (the resolved config),
comparison.csv and comparison.png.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError
from schedulers.dag import make_dag
from sim.dag import DagPlan, DagProblem, compact_schedule, dag_costs, planning_costs
from sim.dag_config import load_dag_config
from sim.des.frames import FrameOptions
from sim.evaluate import evaluate
from sim.result import FrameResult

TRACE_FRAMES = 3


#: The comparison / sweep columns of one DAG run, in order (the RunResult headline,
#: HEADLINE_KEYS, follows them).
DAG_KEYS = ("mode", "plan_feasible", "plan_frame_ms", "plan_effects_ms", "deadline_ms", "plan_energy_mj",
            "plan_s", "des_miss_rate", "miss_tolerance", "des_miss_ok", "des_latency_p99_ms", "des_energy_mj")


def plan_and_simulate(problem: DagProblem, opts: FrameOptions, name: str, params: dict[str, Any],
                      source: str, trace_frames: int = TRACE_FRAMES) -> tuple[dict[str, Any], dict[str, str]]:
    """Plan with one DAG scheduler and run the frames DES: (row, files name -> text)."""
    sched = make_dag(name, params, source)
    t0 = time.perf_counter()
    try:
        planned = sched.plan(problem)
        cp = planning_costs(problem, planned.mode)
        c = dag_costs(problem, planned.mode)
    except ValueError as e:
        raise ConfigError(source, "pipeline", str(e)) from None
    plan_s = time.perf_counter() - t0
    # the scheduler's units and order, timed as the plan runs without slowdowns
    plan = (dataclasses.replace(compact_schedule(c, planned.unit, planned.start_s), scheduler=planned.scheduler,
                                proven=planned.proven) if problem.time_scale else planned)
    res = evaluate(problem, plan, "des", frames=dataclasses.replace(opts, trace_frames=trace_frames))
    assert isinstance(res, FrameResult)
    row = dag_row(name, plan, res, planned.feasible(cp), plan.energy_j(c), plan_s,
                  planned.makespan_s(cp), opts.miss_tolerance)
    files = {"plan.json": json.dumps(plan.to_dict(c), indent=1) + "\n",
             "summary.json": json.dumps({**row, "des": res.summary()}, indent=1, sort_keys=True) + "\n",
             "frames.csv": res.frames_csv()}
    if trace_frames:
        files["trace.json"] = res.trace_json()
    return row, files


def dag_row(name: str, plan: DagPlan, res: FrameResult, feasible: bool, plan_energy_j: float,
            plan_s: float, effects_s: float, tolerance: float) -> dict[str, Any]:
    """One DAG run's comparison / sweep row: the scheduler, DAG_KEYS, then the headline.

    ``plan_frame_ms`` is the plan's frame time with nominal execution times,
    ``plan_effects_ms`` (``effects_s``) the one it was planned with (the DES's load
    and jitter priced in), ``plan_feasible`` whether that one meets the deadline and
    the period; ``des_miss_ok`` whether the DES missed at most ``tolerance`` of frames.
    """
    frames = res.frames_summary()
    miss = frames["deadline_miss_rate"]
    return {"scheduler": name, "mode": plan.mode, "plan_feasible": feasible,
            "plan_frame_ms": 1e3 * res.makespan_s, "plan_effects_ms": 1e3 * effects_s,
            "deadline_ms": 1e3 * res.deadline_s, "plan_energy_mj": 1e3 * plan_energy_j, "plan_s": plan_s,
            "des_miss_rate": miss, "miss_tolerance": tolerance, "des_miss_ok": bool(miss <= tolerance),
            "des_latency_p99_ms": 1e3 * frames["latency_p99_s"],
            "des_energy_mj": 1e3 * frames["energy_per_frame_j"], **res.headline()}


def miss_warning(row: dict[str, Any]) -> str | None:
    """One line when a row's DES miss rate exceeds its tolerance, else None."""
    if row["des_miss_ok"]:
        return None
    frame, priced = row["plan_frame_ms"], row["plan_effects_ms"]
    how = (f"{priced:.2f} ms with the DES's load and jitter priced in" if priced > frame * (1 + 1e-9)
           else "planned with nominal times")
    return (f"{row['scheduler']}: the frames DES misses {row['des_miss_rate']:.1%} of frames, over the "
            f"config's miss_tolerance {row['miss_tolerance']:.1%} (planned frame {frame:.2f} ms, {how}; "
            f"deadline {row['deadline_ms']:g} ms)")


def run_one(problem: DagProblem, opts: FrameOptions, name: str, params: dict[str, Any], out: Path,
            source: str) -> dict[str, Any]:
    """Plan with one scheduler, simulate, write its folder (and a Gantt chart); its row."""
    row, files = plan_and_simulate(problem, opts, name, params, source)
    if warning := miss_warning(row):
        print(f"hetsim: warning: {warning}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    for fname, text in files.items():
        (out / fname).write_text(text)
    from experiments import plots

    plots.gantt(out / "trace.json", out / "gantt.png", iterations=10**9,
                title=f"{problem.graph.name} on {problem.board.name} ({name}, {row['mode']}): "
                      f"first {TRACE_FRAMES} frames")
    return row


def run_dag(config: str | Path, names: Sequence[str] | None, out: Path) -> list[dict[str, Any]]:
    cfg, problem, opts = load_dag_config(config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=1) + "\n")
    # the config's own scheduler keeps its params when it is among the names
    runs = ([(n, cfg.scheduler.params if n == cfg.scheduler.name else {}) for n in names] if names
            else [(cfg.scheduler.name, cfg.scheduler.params)])
    rows = [run_one(problem, opts, n, p, out / n, str(config)) for n, p in runs]
    _chart(rows, out / "comparison.png", f"{problem.graph.name} on {problem.board.name}")
    return rows


def _chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    from experiments.plot_dirs import dag_comparison_chart

    dag_comparison_chart(rows, path, title)
