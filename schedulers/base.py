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

import numpy as np

from sim.errors import ConfigError
from sim.observation import Observation
from sim.plan import Plan, PlanKind, Replica, Stage
from sim.problem import Problem
from sim.scheduling import OnlineScheduler, Scheduler  # noqa: F401  (the contracts, re-exported)


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


def names(kind: str | None = "training") -> list[str]:
    """Registered names planning problems of ``kind`` (None: every kind)."""
    return sorted(n for n in _REGISTRY if kind is None or _KIND[n] == kind)


def kind_of(name: str) -> str:
    return _KIND[name]


def make(name: str, params: dict[str, Any] | None = None, source: str = "<config>") -> Scheduler:
    """Instantiate a registered training scheduler with ``params``; one-line ConfigError on misuse."""
    return instantiate(name, params, source, "training")  # type: ignore[no-any-return]


def instantiate(name: str, params: dict[str, Any] | None, source: str, kind: str) -> Any:
    """Instantiate a registered scheduler of ``kind`` with ``params``; one-line ConfigError on misuse."""
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


def largest_remainder(weights: Sequence[float] | np.ndarray, total: int) -> list[int]:
    """Non-negative integers proportional to ``weights`` that sum to ``total``.

    Floors of the exact quotas, then one more to the largest remainders
    (ties to the lower index), so the result is deterministic.
    """
    return capped_largest_remainder(weights, [None] * len(weights), total)[0]


def data_parallel_plan(problem: Problem, shares: Sequence[int], scheduler: str) -> Plan:
    """A one-stage plan over the inventory in order; devices with a zero share are left out."""
    devs = problem.cluster.devices
    reps = tuple(Replica(d.id, int(b)) for d, b in zip(devs, shares) if b > 0)
    types = {problem.cluster.device(r.device).type.name for r in reps}
    stage = Stage(0, len(problem.job.model.layers), reps, types.pop() if len(types) == 1 else None)
    return Plan((stage,), tuple(s.id for s in problem.cluster.shards), scheduler, kind=PlanKind.DATA_PARALLEL)


def capped_largest_remainder(weights: Sequence[float] | np.ndarray, caps: Sequence[int | None],
                             total: int) -> tuple[list[int], int]:
    """Integers proportional to ``weights`` summing to ``total`` with ``share_i <= caps[i]``.

    Water-filling: shares proportional to weight; every share above its cap is
    fixed at the cap and the remainder is spread over the uncapped workers in
    proportion to their weights, until no cap is violated. Then the quotas are
    rounded by largest remainder (ties to the lower index) without passing a
    cap. A weight of 0 gets 0; a cap of None is no cap. If the caps of the
    positive-weight workers cannot hold ``total``, every such worker gets its
    cap.

    Returns:
        (shares, short): ``short = total - sum(shares)``, 0 unless memory is short.
    """
    w = np.asarray(weights, dtype=float)
    if total < 0 or w.size == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, finite and not all zero; total >= 0")
    if len(caps) != w.size or any(c is not None and c < 0 for c in caps):
        raise ValueError("one non-negative cap (or None) per weight")
    cap = np.array([float(total) if c is None else float(min(c, total)) for c in caps])
    cap[w <= 0] = 0.0
    if cap.sum() <= total:
        shares = [int(x) for x in cap]
        return shares, total - sum(shares)
    quota = np.zeros(w.size)
    fixed = np.zeros(w.size, dtype=bool)
    fixed[w <= 0] = True
    while True:
        free = ~fixed
        if not free.any():
            break
        rest = total - cap[fixed & (w > 0)].sum()
        quota[free] = w[free] / w[free].sum() * rest
        over = free & (quota > cap)
        if not over.any():
            break
        fixed |= over
        quota[over] = cap[over]
    quota[w <= 0] = 0.0
    base = np.minimum(np.floor(quota), cap).astype(int)
    short = total - int(base.sum())
    order = sorted(range(w.size), key=lambda i: (-(quota[i] - base[i]), i))
    while short > 0:  # one pass suffices in exact arithmetic; more guard float rounding
        progress = False
        for i in order:
            if short > 0 and base[i] + 1 <= cap[i] and w[i] > 0:
                base[i] += 1
                short -= 1
                progress = True
        if not progress:
            break
    return [int(x) for x in base], short
