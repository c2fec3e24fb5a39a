"""The scheduler registry (the contracts, :class:`Scheduler` and
:class:`OnlineScheduler`, are in :mod:`sim.scheduling`, where the evaluators
read them).

A scheduler reads a Problem and returns a Plan; it never reaches into an
evaluator. Online schedulers also answer ``rebalance(plan, observation)``.
Registration is by name with a decorator that refuses duplicates; heavy
schedulers register lazily as "module:Class" strings so their imports happen
only when chosen.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from hardware_profiles.errors import ConfigError
from sim.observation import Observation
from sim.plan import Plan, PlanKind, Replica, Stage
from sim.problem import Problem
from sim.scheduling import OnlineScheduler, Scheduler  # noqa: F401  (the contracts, re-exported)

# the apportionment schedulers use, re-exported: its one implementation lives in sim/shares.py
from sim.shares import capped_largest_remainder as capped_largest_remainder
from sim.shares import largest_remainder as largest_remainder


class RateEstimate:
    """Exponentially smoothed per-worker rates (samples/s) from Observations.

    ``smoothed = alpha * observed + (1 - alpha) * smoothed``; the first
    measurement of a worker is taken as is, and a window without one (rate 0:
    the worker computed nothing) keeps the previous estimate.
    """

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.rate_sps: dict[str, float] = {}

    def update(self, obs: Observation) -> None:
        for w in obs.workers:
            if w.rate_sps <= 0:
                continue
            old = self.rate_sps.get(w.device)
            self.rate_sps[w.device] = w.rate_sps if old is None else (
                self.alpha * w.rate_sps + (1.0 - self.alpha) * old)

    def live_rates(self, obs: Observation) -> list[float] | None:
        """Estimated rate of every worker in observation order: 0 for failed ones,
        the mean of the known live ones for a live worker never measured; None
        when no live worker has been measured yet."""
        known = [self.rate_sps[w.device] for w in obs.workers if w.alive and w.device in self.rate_sps]
        if not known:
            return None
        mean = sum(known) / len(known)
        return [0.0 if not w.alive else self.rate_sps.get(w.device, mean) for w in obs.workers]


_REGISTRY: dict[str, type | str] = {}
#: The kind of problem each scheduler plans: "training" (Problem -> Plan, the DNN
#: training problems A and B) or "dag" (DagProblem -> DagPlan, robotics pipelines).
_KIND: dict[str, str] = {}
KINDS = ("training", "dag")


def _claim(name: str, kind: str) -> None:
    if name in _REGISTRY:
        raise ValueError(f"scheduler {name!r} is already registered")
    if kind not in KINDS:
        raise ValueError(f"unknown scheduler kind {kind!r} (known: {', '.join(KINDS)})")
    _KIND[name] = kind


def register(name: str, kind: str = "training") -> Callable[[type], type]:
    """Class decorator: register a scheduler under ``name`` (duplicates are an error)."""

    def deco(cls: type) -> type:
        _claim(name, kind)
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return deco


def register_lazy(name: str, target: str, kind: str = "training") -> None:
    """Register ``"module:Class"`` under ``name`` without importing it."""
    _claim(name, kind)
    _REGISTRY[name] = target


#: The entry-point group through which installed distributions add schedulers:
#: ``NAME = "module:Class"`` (registered as NAME, a training scheduler unless the class
#: says ``kind = "dag"``) or ``NAME = "module"`` (imported; its decorators register).
ENTRY_POINT_GROUP = "hetsim.schedulers"


_entry_points_loaded = False


def load_entry_points() -> None:
    """Register the schedulers of the ``hetsim.schedulers`` entry-point group, once.

    Called when the registry is first read (:func:`names`, :func:`make`), not when
    this package is imported: a plugin imports ``hetsim``, which imports the
    packages that import this one. An entry point whose name is registered already
    (a built-in, or loaded before) is skipped; a broken one is a one-line error
    naming it.
    """
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
        except Exception as e:  # the plugin's own import error: name the entry point
            raise ConfigError(f"entry point {ENTRY_POINT_GROUP}:{ep.name}", ep.value,
                              f"cannot load: {type(e).__name__}: {e}") from None
        if inspect.isclass(obj) and ep.name not in _REGISTRY:
            register(ep.name, getattr(obj, "kind", "training"))(obj)


def import_plugin(module: str) -> None:
    """Import ``module`` (``--plugin``) so that its ``@register`` decorators run: from
    the working directory first, then the Python path; a module that cannot be
    imported is a one-line error naming it."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError("<command line>", "--plugin", f"cannot import {module!r}: {e}") from None


def names(kind: str | None = "training", plugins: bool = True) -> list[str]:
    """Registered names planning problems of ``kind`` (None: every kind); with
    ``plugins`` false, without loading the entry points first."""
    if plugins:
        load_entry_points()
    return sorted(n for n in _REGISTRY if kind is None or _KIND[n] == kind)


def kind_of(name: str) -> str:
    load_entry_points()
    return _KIND[name]


def make(name: str, params: dict[str, Any] | None = None, source: str = "<config>") -> Scheduler:
    """Instantiate a registered training scheduler with ``params``; one-line ConfigError on misuse."""
    return instantiate(name, params, source, "training")  # type: ignore[no-any-return]


def instantiate(name: str, params: dict[str, Any] | None, source: str, kind: str) -> Any:
    """Instantiate a registered scheduler of ``kind`` with ``params``; one-line ConfigError on misuse."""
    load_entry_points()
    if name not in _REGISTRY:
        raise ConfigError(source, "scheduler.name",
                          f"unknown scheduler {name!r}; known: {', '.join(names(kind))}")
    if _KIND[name] != kind:
        raise ConfigError(source, "scheduler.name", f"scheduler {name!r} plans {_KIND[name]} problems, "
                          f"not {kind} ones; known: {', '.join(names(kind))}")
    cls = _REGISTRY[name]
    if isinstance(cls, str):
        mod, _, attr = cls.partition(":")
        cls = getattr(importlib.import_module(mod), attr)
        _REGISTRY[name] = cls
    params = dict(params or {})
    sig = inspect.signature(cls)
    for k in params:
        if k not in sig.parameters:
            raise ConfigError(source, f"scheduler.params.{k}", f"unknown parameter of scheduler {name!r}")
    try:
        return cls(**params)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as e:
        raise ConfigError(source, "scheduler.params", str(e)) from None


def data_parallel_plan(problem: Problem, shares: Sequence[int], scheduler: str) -> Plan:
    """A one-stage plan over the inventory in order; devices with a zero share are left out."""
    devs = problem.cluster.devices
    reps = tuple(Replica(d.id, int(b)) for d, b in zip(devs, shares) if b > 0)
    types = {problem.cluster.device(r.device).type.name for r in reps}
    stage = Stage(0, len(problem.job.model.layers), reps, types.pop() if len(types) == 1 else None)
    return Plan((stage,), tuple(s.id for s in problem.cluster.shards), scheduler, kind=PlanKind.DATA_PARALLEL)
