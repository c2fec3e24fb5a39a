"""``hetsim dag CONFIG``: plan a robotics pipeline with DAG schedulers and run the frames DES.

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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError
from schedulers.dag import make_dag
from sim.dag import DagPlan, DagProblem, dag_costs
from sim.dag_config import load_dag_config
from sim.des.frames import FrameOptions
from sim.evaluate import evaluate
from sim.result import FrameResult

TRACE_FRAMES = 3


#: The comparison / sweep columns of one DAG run, in order (the RunResult headline,
#: HEADLINE_KEYS, follows them).
DAG_KEYS = ("mode", "plan_feasible", "plan_frame_ms", "deadline_ms", "plan_energy_mj", "plan_s",
            "des_miss_rate", "des_latency_p99_ms", "des_energy_mj")


def plan_and_simulate(problem: DagProblem, opts: FrameOptions, name: str, params: dict[str, Any],
                      source: str, trace_frames: int = TRACE_FRAMES) -> tuple[dict[str, Any], dict[str, str]]:
    """Plan with one DAG scheduler and run the frames DES: (row, files name -> text)."""
    sched = make_dag(name, params, source)
    t0 = time.perf_counter()
    try:
        plan = sched.plan(problem)
        c = dag_costs(problem, plan.mode)
    except ValueError as e:
        raise ConfigError(source, "pipeline", str(e)) from None
    plan_s = time.perf_counter() - t0
    res = evaluate(problem, plan, "des", frames=dataclasses.replace(opts, trace_frames=trace_frames))
    assert isinstance(res, FrameResult)
    row = dag_row(name, plan, res, plan.feasible(c), plan.energy_j(c), plan_s)
    files = {"plan.json": json.dumps(plan.to_dict(c), indent=1) + "\n",
             "summary.json": json.dumps({**row, "des": res.summary()}, indent=1, sort_keys=True) + "\n",
             "frames.csv": res.frames_csv()}
    if trace_frames:
        files["trace.json"] = res.trace_json()
    return row, files


def dag_row(name: str, plan: DagPlan, res: FrameResult, feasible: bool, plan_energy_j: float,
            plan_s: float) -> dict[str, Any]:
    """One DAG run's comparison / sweep row: the scheduler, DAG_KEYS, then the headline."""
    frames = res.frames_summary()
    return {"scheduler": name, "mode": plan.mode, "plan_feasible": feasible,
            "plan_frame_ms": 1e3 * res.makespan_s, "deadline_ms": 1e3 * res.deadline_s,
            "plan_energy_mj": 1e3 * plan_energy_j, "plan_s": plan_s,
            "des_miss_rate": frames["deadline_miss_rate"], "des_latency_p99_ms": 1e3 * frames["latency_p99_s"],
            "des_energy_mj": 1e3 * frames["energy_per_frame_j"], **res.headline()}


def run_one(problem: DagProblem, opts: FrameOptions, name: str, params: dict[str, Any], out: Path,
            source: str) -> dict[str, Any]:
    """Plan with one scheduler, simulate, write its folder (and a Gantt chart); its row."""
    row, files = plan_and_simulate(problem, opts, name, params, source)
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
