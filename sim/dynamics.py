"""Worker status traces: config dynamics (explicit events and patterns) -> Dynamic events.

A worker's status is two step functions of time: a slowdown factor (compute-time
multiplier, background load) and the fraction of its memory free for training.
Both start at 1.0. Each :class:`Dynamic` event sets one or both from
its ``at_s`` on (``None`` leaves a value unchanged); a later event wins.

Patterns (see :mod:`sim.config` for every field):

* ``steps``: the listed values at the listed times, the same for every worker named.
* ``random_walk``: from ``start`` at t = 0, one step every ``every_s`` while
  ``t < until_s``, ``x <- clip(x * exp(sigma * z), min, max)`` with z ~ N(0, 1)
  (a walk in log space, so a step is a relative change; clamped after every
  step). ``ceil(until_s / every_s)`` events per worker; the last value holds.
* ``periodic``: windows ``[phase + k * period_s, phase + k * period_s + duty * period_s)``
  for k = 0, 1, ... that start before ``until_s``; the pattern's values inside,
  1.0 outside. A window still open at ``until_s`` is closed there. ``phase`` is
  ``phase_s``, plus a per-worker draw from U[0, period_s) if ``random_phase``.

Seeding (STYLE item 7): the draws of dynamics entry ``i`` (its index in the
config's list) for worker ``w`` come from
``np.random.SeedSequence(seed, spawn_key=(DYNAMICS_STREAM, i, w))``, which is
``SeedSequence(seed).spawn(DYNAMICS_STREAM + 1)[-1].spawn(i + 1)[i].spawn(w + 1)[w]``:
adding, removing or editing another entry does not change an entry's draws
(inserting one before it shifts its index, and so its draws). A random walk
spawns one child of that for slowdown (0) and one for free memory (1), so giving
or omitting one walk leaves the other's values alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from hardware_profiles.errors import ConfigError
from sim.config import (
    DynamicsEntry,
    Pattern,
    PeriodicPattern,
    RandomWalkPattern,
    StepsPattern,
    Walk,
)

#: Spawn-key namespace of the dynamics streams under the config's root seed
#: (b"DYN"), so they never coincide with another component's ``spawn(n)`` children.
DYNAMICS_STREAM = 0x44594E
#: Most events the dynamics of one config may expand to (each becomes a SimPy process).
MAX_EVENTS = 1_000_000


@dataclass(frozen=True)
class Dynamic:
    """A change of worker ``worker``'s status (index into ``cluster.devices``) at ``at_s``.

    Attributes:
        slowdown: compute-time multiplier from ``at_s`` on (background load).
        fail: the worker dies at ``at_s``.
        free_memory_frac: fraction of the device's memory free for training from
            ``at_s`` on (co-located jobs take the rest); None leaves it unchanged.
    """

    worker: int
    at_s: float
    slowdown: float | None = None
    fail: bool = False
    free_memory_frac: float | None = None


def seed_sequence(seed: int, entry: int, worker: int) -> np.random.SeedSequence:
    """The seed sequence of dynamics entry ``entry`` on worker ``worker``."""
    return np.random.SeedSequence(seed, spawn_key=(DYNAMICS_STREAM, entry, worker))


def workers_of(pattern: Pattern, n_workers: int) -> list[int]:
    """The worker indices a pattern names (``all`` = every worker, in order)."""
    return list(range(n_workers)) if pattern.workers == "all" else list(pattern.workers)


def _n_steps(until_s: float, every_s: float) -> int:
    # Steps at k * every_s < until_s. A ratio within rounding of an integer counts
    # as that integer, so 1.0 / 0.1 gives 10 steps, not 11.
    r = until_s / every_s
    k = round(r)
    return int(k) if abs(r - k) <= 1e-9 * max(1.0, r) else math.ceil(r)


def _n_windows(p: PeriodicPattern, phase: float) -> int:
    return 0 if phase >= p.until_s else _n_steps(p.until_s - phase, p.period_s)


def count_events(pattern: Pattern, n_workers: int) -> int:
    """How many events :func:`expand` gives (an upper bound for ``periodic``), without
    generating them."""
    n = len(workers_of(pattern, n_workers))
    if isinstance(pattern, StepsPattern):
        return n * len(pattern.times_s)
    if isinstance(pattern, RandomWalkPattern):
        return n * _n_steps(pattern.until_s, pattern.every_s)
    # a random phase only moves the first window later, so phase_s gives the most windows
    return n * 2 * _n_windows(pattern, pattern.phase_s)


def _walk(spec: Walk, n: int, rng: np.random.Generator) -> list[float]:
    z = rng.standard_normal(max(n - 1, 0))
    out, x = [spec.start], spec.start
    step = np.exp(spec.sigma * z)
    for f in step.tolist():
        x = min(max(x * f, spec.min), spec.max)
        out.append(x)
    return out


def expand(pattern: Pattern, entry: int, seed: int, n_workers: int) -> list[Dynamic]:
    """The events of one pattern entry, worker by worker, each worker's in time order.

    Args:
        pattern: a validated pattern entry.
        entry: its index in the config's ``dynamics`` list (selects its random streams).
        seed: the config's root seed.
        n_workers: workers in the inventory (what ``all`` means).
    """
    out: list[Dynamic] = []
    for w in workers_of(pattern, n_workers):
        if isinstance(pattern, StepsPattern):
            for k, t in enumerate(pattern.times_s):
                s = pattern.slowdown[k] if pattern.slowdown is not None else None
                f = pattern.free_memory[k] if pattern.free_memory is not None else None
                out.append(Dynamic(w, float(t), slowdown=s, free_memory_frac=f))
        elif isinstance(pattern, RandomWalkPattern):
            n = _n_steps(pattern.until_s, pattern.every_s)
            ss_slow, ss_mem = seed_sequence(seed, entry, w).spawn(2)
            slow = mem = None
            if pattern.slowdown is not None:
                slow = _walk(pattern.slowdown, n, np.random.default_rng(ss_slow))
            if pattern.free_memory is not None:
                mem = _walk(pattern.free_memory, n, np.random.default_rng(ss_mem))
            for k in range(n):
                out.append(Dynamic(w, k * pattern.every_s,
                                   slowdown=slow[k] if slow is not None else None,
                                   free_memory_frac=mem[k] if mem is not None else None))
        else:
            p = pattern
            phase = p.phase_s
            if p.random_phase:
                phase += float(np.random.default_rng(seed_sequence(seed, entry, w)).uniform(0.0, p.period_s))
            on_s = p.duty * p.period_s
            idle_s = 1.0 if p.slowdown is not None else None
            idle_f = 1.0 if p.free_memory is not None else None
            for k in range(_n_windows(p, phase)):
                start = phase + k * p.period_s
                out.append(Dynamic(w, start, slowdown=p.slowdown, free_memory_frac=p.free_memory))
                out.append(Dynamic(w, min(start + on_s, p.until_s), slowdown=idle_s, free_memory_frac=idle_f))
    return out


def build_dynamics(entries: Sequence[DynamicsEntry | Pattern], seed: int, n_workers: int,
                   source: str = "<config>") -> tuple[Dynamic, ...]:
    """Explicit entries and expanded patterns, merged and sorted by (at_s, worker,
    order in the list); within one entry, generation order.

    Raises:
        ConfigError: a worker index that does not exist, or more than
            :data:`MAX_EVENTS` events in all (naming the entry that crossed it).
    """
    events: list[Dynamic] = []
    for i, e in enumerate(entries):
        if isinstance(e, DynamicsEntry):
            _check_worker(e.worker, n_workers, source, f"dynamics[{i}].worker")
            events.append(Dynamic(e.worker, e.at_s, e.slowdown, e.fail, e.free_memory))
            continue
        if e.workers != "all":
            for k, w in enumerate(e.workers):
                _check_worker(w, n_workers, source, f"dynamics[{i}].workers[{k}]")
        n = count_events(e, n_workers)
        if len(events) + n > MAX_EVENTS:
            raise ConfigError(
                source, f"dynamics[{i}]",
                f"dynamics expand to more than {MAX_EVENTS:,} events ({len(events) + n:,} up to this "
                "entry); use fewer workers, a longer step or period, or an earlier until_s",
            )
        events.extend(expand(e, i, seed, n_workers))
    # sorted() is stable: ties in (at_s, worker) keep list order, so a later entry wins.
    return tuple(sorted(events, key=lambda d: (d.at_s, d.worker)))


def _check_worker(w: int, n_workers: int, source: str, field: str) -> None:
    if w >= n_workers:
        raise ConfigError(source, field, f"worker {w} does not exist ({n_workers} devices)")


def status_trace(events: Iterable[Dynamic], worker: int,
                 until_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One worker's status as step arrays over [0, until_s].

    Returns:
        ``(times, slowdown, free_memory_frac)``: equal-length float arrays; the
        values hold on ``[times[k], times[k + 1])`` (``plt.step(..., where="post")``).
        ``times`` starts at 0.0 (status 1.0 / 1.0 unless an event is at 0) and
        ends with ``until_s`` repeating the last values. Several events at one time
        collapse into one point (the last wins); events after ``until_s`` and
        failures are left out.
    """
    times, slow, mem = [0.0], [1.0], [1.0]
    for d in events:  # in the order given: Problem.dynamics is sorted by time
        if d.worker != worker or d.fail or d.at_s > until_s:
            continue
        s = d.slowdown if d.slowdown is not None else slow[-1]
        f = d.free_memory_frac if d.free_memory_frac is not None else mem[-1]
        if d.at_s == times[-1]:
            slow[-1], mem[-1] = s, f
        else:
            times.append(d.at_s)
            slow.append(s)
            mem.append(f)
    if times[-1] < until_s:
        times.append(until_s)
        slow.append(slow[-1])
        mem.append(mem[-1])
    return np.array(times), np.array(slow), np.array(mem)
