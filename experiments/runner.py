"""Config in, results out: the steps every command shares.

load -> Problem -> scheduler.plan -> evaluator -> files. Scripts and the CLI
call these; nothing here models anything.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import schedulers
from hardware_profiles.errors import ConfigError
from schedulers import Scheduler
from sim import evaluate as evaluation
from sim.config import Config, JobConfig, config_from_dict, read_yaml
from sim.evaluate import EVALUATORS
from sim.plan import Plan, PlanKind, check_plan, load_plan
from sim.problem import Problem, build_problem
from sim.result import RunResult


@dataclass
class Loaded:
    """A validated config with where it came from."""

    config: Config
    base_dir: Path
    source: str


def load(path: str | Path) -> Loaded:
    """Read and validate a YAML config."""
    p = Path(path)
    return Loaded(config_from_dict(read_yaml(p), str(p)), p.resolve().parent, str(p))


def from_dict(data: dict[str, Any], base_dir: Path, source: str) -> Loaded:
    return Loaded(config_from_dict(data, source), base_dir, source)


def problem_of(loaded: Loaded) -> Problem:
    return build_problem(loaded.config, loaded.base_dir, loaded.source)


def schedule(loaded: Loaded, problem: Problem, scheduler: str | None = None) -> tuple[Scheduler, Plan]:
    """The named scheduler (default: the config's) and its plan, checked against the problem.

    The scheduler object is returned too: an online one
    (:class:`~sim.scheduling.OnlineScheduler`) keeps driving the plan during evaluation.
    """
    cfg = loaded.config.scheduler
    name = scheduler or cfg.name
    params = cfg.params if name == cfg.name else {}
    sched = schedulers.make(name, params, loaded.source)
    plan = sched.plan(problem)
    check_plan(plan, problem, source=f"plan from scheduler {name!r}")
    return sched, plan


def plan_for(loaded: Loaded, problem: Problem, scheduler: str | None = None) -> Plan:
    """Plan with the named scheduler (default: the config's), checked against the problem."""
    return schedule(loaded, problem, scheduler)[1]


def evaluate(problem: Problem, plan: Plan, evaluator: str, trace: bool = True,
             progress: bool = False, scheduler: Scheduler | None = None) -> RunResult:
    """Evaluate with ``des`` or ``analytic`` (:func:`sim.evaluate.evaluate`, which picks the
    model of the plan's kind); ``progress`` shows a bar of DES iterations (on a terminal
    only). ``scheduler``: the object that made ``plan``; an online one rebalances during
    the run (DES) or to its steady state (analytic)."""
    if evaluator not in EVALUATORS:
        raise ConfigError("<command line>", "--evaluator",
                          f"unknown evaluator {evaluator!r}; use {' or '.join(EVALUATORS)}")
    if evaluator != "des" or not progress:
        return evaluation.evaluate(problem, plan, evaluator, scheduler=scheduler, trace=trace)
    from tqdm import tqdm

    with tqdm(total=problem.job.iterations, desc=f"des {plan.scheduler}", unit="it",
              leave=False, disable=None) as bar:
        return evaluation.evaluate(problem, plan, evaluator, scheduler=scheduler, trace=trace,
                                   on_iteration=lambda n: bar.update(n - bar.n))


def run_files(result: RunResult, plan: Plan, loaded: Loaded, trace: bool = True) -> dict[str, str]:
    """The files of one run as {file name: text}: summary.json, iterations.csv,
    trace.json (unless ``trace`` is false or the run recorded no timeline, as the
    analytic evaluator does not), plan.json and the resolved config.json.

    Sweeps build these in the worker and write them in the parent, so a remote
    (dask) worker needs no access to the output folder.
    """
    files = {"summary.json": result.summary_json(), "iterations.csv": result.iterations_csv()}
    if trace and result.trace:
        files["trace.json"] = result.trace_json()
    files["plan.json"] = plan.dumps()
    files["config.json"] = json.dumps(loaded.config.model_dump(mode="json"), indent=2) + "\n"
    return files


def write_run(out: Path, result: RunResult, plan: Plan, loaded: Loaded, trace: bool = True) -> list[str]:
    """Write :func:`run_files` into ``out`` (created if missing); return the names written.
    A trace.json of an earlier run in ``out`` is removed when this run writes none: it
    would show another run's timeline beside this run's summary."""
    out.mkdir(parents=True, exist_ok=True)
    files = run_files(result, plan, loaded, trace)
    for name, text in files.items():
        (out / name).write_text(text)
    if "trace.json" not in files:
        (out / "trace.json").unlink(missing_ok=True)
    return list(files)


def run_one(loaded: Loaded, evaluator: str, scheduler: str | None = None,
            out: Path | None = None, trace: bool = True,
            progress: bool = False, plan_file: str | Path | None = None) -> tuple[RunResult, Plan]:
    """Plan (or read ``plan_file``) and evaluate one config; write the run's files
    into ``out`` when given."""
    problem = problem_of(loaded)
    sched: Scheduler | None = None
    if plan_file is not None:  # a plan file is evaluated as given: nobody rebalances it
        plan = load_plan(plan_file)
        check_plan(plan, problem, source=str(plan_file))
    else:
        sched, plan = schedule(loaded, problem, scheduler)
    result = evaluate(problem, plan, evaluator, trace=trace, progress=progress, scheduler=sched)
    for key in ("incomplete", "note"):
        if key in result.extra:
            print(f"hetsim: warning: {result.extra[key]}", file=sys.stderr)
    for note in result.extra.get("notes", ()):
        print(f"hetsim: note: {note}", file=sys.stderr)
    if result.model_steady is not None:  # too short a run: its throughput is the model's
        print(f"hetsim: warning: {result.model_steady.note}", file=sys.stderr)
    if out is not None:
        write_run(out, result, plan, loaded, trace=trace)
    return result, plan


#: The columns :func:`update_columns` adds to a comparison row.
UPDATE_COLUMNS = ("plan_kind", "sync", "staleness_bound", "throughput_window")


def update_columns(result: RunResult, plan: Plan, job: JobConfig) -> dict[str, Any]:
    """How ``plan``'s updates were applied, for a comparison row: the plan kind, the sync
    mode, the staleness bound (how many iterations' updates the parameters a worker
    computes with may lack: 0 under BSP, ``job.staleness`` under SSP, ``inf`` under
    ASP) and the kind of throughput window (:data:`sim.result.WINDOW_KINDS`).

    A placement plan runs its stages as a pipeline whatever ``job.sync`` says: each
    stage pulls the parameters of iteration k after the update of k - lag
    (``staleness_bound`` per stage in its summary), bounded staleness, so "ssp"
    with the largest lag.
    """
    if plan.kind is PlanKind.PLACEMENT:
        sync, bound = "ssp", float(max(result.extra.get("staleness_bound") or [0]))
    else:
        sync = job.sync
        bound = {"bsp": 0.0, "ssp": float(job.staleness)}.get(sync, math.inf)
    return {"plan_kind": plan.kind.value, "sync": sync,
            "staleness_bound": int(bound) if math.isfinite(bound) else bound,
            "throughput_window": result.throughput_window()["kind"]}


def staleness_warning(rows: list[dict[str, Any]]) -> str | None:
    """One line when ``rows`` (comparison rows with :func:`update_columns`) rank plans
    whose staleness bounds differ, else None: a stale update may be worth less than a
    fresh one, so their samples/s do not compare one to one."""
    groups: dict[Any, list[str]] = {}
    for r in rows:
        groups.setdefault(r["staleness_bound"], []).append(str(r["scheduler"]))
    if len(groups) < 2:
        return None
    parts = "; ".join(f"{b}: {', '.join(names)}" for b, names in groups.items())
    return (f"these plans train with different staleness bounds ({parts}): a stale update may "
            "be worth less than a fresh one, so their throughputs do not compare one to one")
