"""The scheduler contract and its registry.

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
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from sim.errors import ConfigError
from sim.plan import Plan, Replica, Stage
from sim.problem import Problem


@runtime_checkable
class Scheduler(Protocol):
    name: ClassVar[str]

    def plan(self, problem: Problem) -> Plan: ...


_REGISTRY: dict[str, type | str] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register a scheduler under ``name`` (duplicates are an error)."""

    def deco(cls: type) -> type:
        if name in _REGISTRY:
            raise ValueError(f"scheduler {name!r} is already registered")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return deco


def register_lazy(name: str, target: str) -> None:
    """Register ``"module:Class"`` under ``name`` without importing it."""
    if name in _REGISTRY:
        raise ValueError(f"scheduler {name!r} is already registered")
    _REGISTRY[name] = target


def names() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, params: dict[str, Any] | None = None, source: str = "<config>") -> Scheduler:
    """Instantiate a registered scheduler with ``params``; one-line ConfigError on misuse."""
    if name not in _REGISTRY:
        raise ConfigError(source, "scheduler.name", f"unknown scheduler {name!r}; known: {', '.join(names())}")
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


def largest_remainder(weights: Sequence[float] | np.ndarray, total: int) -> list[int]:
    """Non-negative integers proportional to ``weights`` that sum to ``total``.

    Floors of the exact quotas, then one more to the largest remainders
    (ties to the lower index), so the result is deterministic.
    """
    w = np.asarray(weights, dtype=float)
    if total < 0 or w.size == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, finite and not all zero; total >= 0")
    quota = w / w.sum() * total
    base = np.floor(quota).astype(int)
    short = total - int(base.sum())
    order = sorted(range(len(w)), key=lambda i: (-(quota[i] - base[i]), i))
    for i in order[:short]:
        base[i] += 1
    return [int(x) for x in base]


def data_parallel_plan(problem: Problem, shares: Sequence[int], scheduler: str) -> Plan:
    """A one-stage plan over the inventory in order; devices with a zero share are left out."""
    devs = problem.cluster.devices
    reps = tuple(Replica(d.id, int(b)) for d, b in zip(devs, shares) if b > 0)
    types = {problem.cluster.device(r.device).type.name for r in reps}
    stage = Stage(0, len(problem.job.model.layers), reps, types.pop() if len(types) == 1 else None)
    return Plan((stage,), tuple(s.id for s in problem.cluster.shards), scheduler)
