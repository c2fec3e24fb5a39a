"""The functions and types of ``import hetsim`` (see :mod:`hetsim`).

Each function takes a config as a path or as what :func:`load_config` returned,
and does what the command of the same name does, without writing files unless
asked (``out``). Errors in the input are :class:`ConfigError` (a
:class:`HetsimError`) naming the file and field, as on the command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import schedulers
from experiments import runner
from experiments.runner import Loaded
from hardware_profiles.errors import ConfigError, HetsimError
from schedulers.base import data_parallel_plan, largest_remainder
from sim import overrides as _overrides
from sim.config import read_yaml
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult
from sim.scheduling import OnlineScheduler, Scheduler

__all__ = [
    "ConfigError", "HetsimError", "Loaded", "OnlineScheduler", "Plan", "Problem", "RunResult",
    "Scheduler", "compare", "data_parallel_plan", "largest_remainder", "load_config", "plan",
    "problem", "register_scheduler", "scheduler_names", "simulate",
]

ConfigLike = str | os.PathLike[str] | Loaded
T = TypeVar("T", bound=type)


def load_config(path: str | os.PathLike[str],
                overrides: Mapping[str, Any] | Sequence[str] = ()) -> Loaded:
    """Read and validate a config file (YAML).

    Args:
        path: the config; relative paths in it (``profiles:``, model files) are
            resolved against its folder.
        overrides: fields to set before validation, as ``--set`` does: a mapping
            ``{"job.iterations": 5}`` (values used as given) or strings
            ``"job.iterations=5"`` (values parsed as YAML).

    Returns:
        The validated config (``.config``, a pydantic model) with where it came from.
    """
    p = Path(path)
    if isinstance(overrides, Mapping):
        parsed = [(k, tuple(k.split(".")), v) for k, v in overrides.items()]
        for key, parts, _ in parsed:
            if not all(parts):
                raise ConfigError(_overrides.SOURCE, f"--set {key}", "empty part in the key path")
    else:
        parsed = _overrides.parse(list(overrides))
    data = _overrides.apply(read_yaml(p), parsed) if parsed else read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(str(p), "", "a config must be a YAML mapping")
    return runner.from_dict(data, p.resolve().parent, str(p))


def _loaded(config: ConfigLike) -> Loaded:
    return config if isinstance(config, Loaded) else load_config(config)


def problem(config: ConfigLike) -> Problem:
    """The config's problem: its cluster, job and objective with profiles and model resolved."""
    return runner.problem_of(_loaded(config))


def plan(config: ConfigLike, scheduler: str | None = None) -> Plan:
    """The plan ``scheduler`` (default: the config's) makes, checked against the problem."""
    loaded = _loaded(config)
    return runner.plan_for(loaded, runner.problem_of(loaded), scheduler)


def simulate(config: ConfigLike, scheduler: str | None = None, evaluator: str = "des",
             out: str | os.PathLike[str] | None = None) -> RunResult:
    """Plan with ``scheduler`` (default: the config's) and evaluate with ``evaluator``
    (``"des"`` or ``"analytic"``), as ``hetsim simulate``; with ``out``, its files
    (summary.json, iterations.csv, trace.json, plan.json, config.json) are written there."""
    result, _ = runner.run_one(_loaded(config), evaluator, scheduler, Path(out) if out else None)
    return result


def compare(config: ConfigLike, names: Sequence[str] | None = None,
            evaluator: str = "des") -> dict[str, RunResult]:
    """Each scheduler's result on the config, in order, as ``hetsim compare``.

    ``names`` default to every registered training scheduler, leaving out those that
    cannot plan this problem; a scheduler named explicitly that fails raises its error.
    """
    loaded = _loaded(config)
    results: dict[str, RunResult] = {}
    for name in names if names is not None else schedulers.names():
        try:
            results[name], _ = runner.run_one(loaded, evaluator, name)
        except HetsimError:
            if names is not None:
                raise
    return results


def register_scheduler(name: str, kind: str = "training") -> Callable[[T], T]:
    """Class decorator: register a scheduler under ``name`` (a duplicate is an error).

    A training scheduler has ``plan(problem: Problem) -> Plan`` (an online one also
    ``rebalance(plan, observation)``); ``kind="dag"`` registers a robotics DAG
    scheduler. Registered, it can be named in a config, ``--scheduler``,
    ``--schedulers`` and :func:`simulate`.
    """
    return schedulers.register(name, kind)  # type: ignore[return-value]


def scheduler_names(kind: str | None = "training") -> list[str]:
    """The registered scheduler names planning problems of ``kind`` (None: every kind)."""
    return schedulers.names(kind)
