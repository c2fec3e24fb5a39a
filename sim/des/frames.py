"""Periodic DAG pipelines in SimPy: many frames of a static schedule under jitter and load.

A :class:`sim.dag.DagPlan` fixes each task's unit and, through its start times,
each unit's order of tasks within a frame. The DES executes that plan the way a
time-triggered robotics runtime does: frame ``f`` is released at
``f * period_s`` plus a release jitter; every unit runs its tasks in the plan's
order, frame after frame; a task starts when its unit has finished the task
before it in that order and every input has arrived (a predecessor on another
unit hands its output over the shared memory in ``comm_s``). Nothing is skipped:
a late frame delays the next, so overload shows as a growing latency.

What varies from the plan's figures:

* execution-time jitter: each execution takes ``time * J`` with J log-normal of
  mean 1 and coefficient of variation ``jitter_cv`` (seeded, one stream per unit);
* background load: a slowdown trace per unit (``load``: any status pattern of
  :mod:`sim.dynamics`, e.g. a periodic co-located job), multiplying the time of
  an execution that starts while it is on;
* shared memory bandwidth (``memory_contention``): an execution that starts
  while others run is stretched in its memory-bound share when the bandwidth
  all of them draw (bytes / time) exceeds the board's. The stretch is decided
  at the start and not revised when the others end (a bound that is tight
  when executions overlap fully).

Energy: the board's idle power over the simulated time plus each unit's busy
extra power over its busy time (as in :meth:`sim.dag.DagPlan.energy_j`, which
this reproduces exactly with no jitter, no load and no contention).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import simpy

from sim.config import Pattern
from sim.dag import DagCosts, DagPlan
from sim.dynamics import expand, status_trace
from sim.result import DeviceUsage, FrameResult, Trace

#: Spawn-key namespace of the frames DES's jitter streams (b"FRM").
FRAMES_STREAM = 0x46524D


@dataclass(frozen=True)
class FrameOptions:
    """How the DES departs from the plan's figures (all off by default).

    Attributes:
        frames: frames to simulate.
        jitter_cv: coefficient of variation of execution times (0: exact times).
        release_jitter_s: each release is delayed by U[0, release_jitter_s).
        load: status patterns (sim.dynamics) whose slowdown applies to units by index.
        memory_contention: stretch memory-bound work when units together draw more
            than the board's bandwidth; needs ``c.mem_s``, ``c.nbytes`` and ``c.mem_bw_Bps``.
        seed: root seed.
        trace_frames: record the first this many frames as Chrome-trace events.
        miss_tolerance: the share of frames a plan may miss (``hetsim dag`` flags a plan
            whose DES misses more; :func:`planning_scale` covers all but this share).
    """

    frames: int = 100
    jitter_cv: float = 0.0
    release_jitter_s: float = 0.0
    load: tuple[Pattern, ...] = ()
    memory_contention: bool = False
    seed: int = 0
    trace_frames: int = 0
    miss_tolerance: float = 0.01


def simulate_frames(c: DagCosts, plan: DagPlan, opts: FrameOptions = FrameOptions(), name: str = "") -> FrameResult:
    """Run ``opts.frames`` frames of ``plan`` (priced by ``c``, in the plan's power mode).

    The result is a RunResult of one iteration per frame (:class:`sim.result.FrameResult`),
    named ``name``: its trace holds the first ``opts.trace_frames`` frames (units as
    threads of the "workers" track, hand-overs as async spans on the "network" track).
    """
    mem_s, nbytes, mem_bw_Bps = c.mem_s, c.nbytes, c.mem_bw_Bps
    if opts.memory_contention and (mem_s is None or nbytes is None or not math.isfinite(mem_bw_Bps)):
        raise ValueError("memory_contention needs DagCosts with mem_s, nbytes and mem_bw_Bps (dag_costs)")
    env = simpy.Environment()
    n, nu = len(c.tasks), len(c.units)
    unit = list(plan.unit)
    order = [sorted((i for i in range(n) if unit[i] == u), key=lambda i: (plan.start_s[i], i))
             for u in range(nu)]
    rngs, release = _streams(c, opts, nu)
    F = opts.frames
    sigma = math.sqrt(math.log1p(opts.jitter_cv ** 2)) if opts.jitter_cv > 0 else 0.0
    horizon = float(release[-1] + 10 * max(c.deadline_s, c.period_s) + 1.0)
    traces = _load_traces(opts, nu, horizon)
    done = [[env.event() for _ in range(n)] for _ in range(F)]
    fin = np.zeros((F, n))
    busy = np.zeros(nu)
    running: dict[int, tuple[float, float]] = {}  # unit -> (bandwidth drawn, its end)
    trace = Trace()

    def duration(i: int, u: int) -> float:
        t = c.time_s[i, u]
        if sigma:
            t *= float(rngs[u].lognormal(-0.5 * sigma * sigma, sigma))
        trace = traces[u]
        if trace is not None:
            times, slow = trace
            t *= float(slow[max(0, int(np.searchsorted(times, env.now, side="right")) - 1)])
        if opts.memory_contention and t > 0:
            assert mem_s is not None and nbytes is not None
            others = sum(bw for v, (bw, end) in running.items() if v != u and end > env.now)
            mine = nbytes[i] / t
            if others + mine > mem_bw_Bps:
                # the memory-bound share of the task stretches by the oversubscription
                share = min(1.0, mem_s[i, u] / c.time_s[i, u]) if c.time_s[i, u] > 0 else 0.0
                t *= 1.0 + share * ((others + mine) / mem_bw_Bps - 1.0)
            running[u] = (nbytes[i] / t, env.now + t)
        return t

    def unit_proc(u: int) -> Generator[simpy.Event, Any, None]:
        for f in range(F):
            for i in order[u]:
                if env.now < release[f]:
                    yield env.timeout(release[f] - env.now)
                ready = float(release[f])
                for p, k in c.preds[i]:
                    if not done[f][p].triggered:
                        yield done[f][p]
                    hand = c.comm_s[k] if unit[p] != u else 0.0
                    ready = max(ready, fin[f, p] + hand)
                    if f < opts.trace_frames and hand > 0:
                        trace.async_span("network", u, c.units[u], f"{c.tasks[p]}->{c.tasks[i]}",
                                         fin[f, p], fin[f, p] + hand)
                if ready > env.now:
                    yield env.timeout(ready - env.now)
                t = duration(i, u)
                yield env.timeout(t)
                busy[u] += t
                fin[f, i] = env.now
                if f < opts.trace_frames:
                    trace.span("workers", u, c.units[u], c.tasks[i], env.now - t, env.now, {"frame": f})
                done[f][i].succeed()

    for u in range(nu):
        if order[u]:
            env.process(unit_proc(u))
    env.run()
    finish = fin.max(axis=1)
    units = [DeviceUsage(u, "worker", 0.0, 0.0, float(c.busy_w[j]), float(busy[j]), float(busy[j]))
             for j, u in enumerate(c.units)]
    return FrameResult(name=name, evaluator="des", scheduler=plan.scheduler, seed=opts.seed,
                       iter_end_s=finish.tolist(), iter_samples=[1] * F, devices=units, trace=trace.events,
                       release_s=release, deadline_s=c.deadline_s, makespan_s=plan.makespan_s(c),
                       duration_s=max(float(finish.max()), F * c.period_s), board_idle_w=c.idle_w)


def planning_scale(opts: FrameOptions, n_units: int, period_s: float) -> tuple[float, ...]:
    """Per unit: the factor on execution times that covers the DES's slowdowns in all
    but ``opts.miss_tolerance`` of executions, for schedulers to plan with
    (:attr:`sim.dag.DagProblem.time_scale`).

    It is the unit's background-load slowdown that is exceeded for at most that
    share of the run's time (``frames * period_s``), times the ``1 - miss_tolerance``
    quantile of the execution-time jitter. Each task is covered on its own, so a
    frame of several tasks is covered with more to spare. Memory contention and
    release jitter are not in it: the DES run checks them. All 1 without jitter and load.
    """
    jitter = 1.0
    if opts.jitter_cv > 0:
        sigma = math.sqrt(math.log1p(opts.jitter_cv ** 2))
        z = NormalDist().inv_cdf(1.0 - opts.miss_tolerance)
        jitter = math.exp(-0.5 * sigma * sigma + z * sigma)
    horizon = opts.frames * period_s
    out = []
    for tr in _load_traces(opts, n_units, horizon):
        load = 1.0
        if tr is not None:
            times, slow = tr
            held = np.diff(np.append(np.clip(times, 0.0, horizon), horizon))  # seconds each step holds
            worst = np.argsort(-slow, kind="stable")
            above = np.cumsum(held[worst]) / horizon  # share of time at or above each slowdown
            k = min(int(np.searchsorted(above, opts.miss_tolerance * (1 + 1e-9), side="right")), len(worst) - 1)
            load = max(1.0, float(slow[worst[k]]))
        out.append(load * jitter)
    return tuple(out)


def _streams(c: DagCosts, opts: FrameOptions, n_units: int) -> tuple[list[np.random.Generator], np.ndarray]:
    """Each unit's random stream (its compute jitter) and the frames' release times, from
    ``opts.seed``: a stream per unit, then one for the release jitter."""
    streams = np.random.SeedSequence(opts.seed, spawn_key=(FRAMES_STREAM,)).spawn(n_units + 1)
    rngs = [np.random.default_rng(s) for s in streams[:n_units]]
    rel_rng = np.random.default_rng(streams[n_units])
    release = np.arange(opts.frames) * c.period_s + (rel_rng.uniform(0.0, opts.release_jitter_s, opts.frames)
                                                     if opts.release_jitter_s > 0 else 0.0)
    return rngs, release


def _load_traces(opts: FrameOptions, n_units: int,
                 horizon: float) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per unit: (times, slowdown) step arrays of the load patterns, None when unloaded."""
    if not opts.load:
        return [None] * n_units
    events = sorted((e for k, p in enumerate(opts.load) for e in expand(p, k, opts.seed, n_units)),
                    key=lambda d: (d.at_s, d.worker))
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for u in range(n_units):
        times, slow, _ = status_trace(events, u, horizon)
        out.append((times, slow) if np.any(slow != 1.0) else None)
    return out
