"""Multi-stage (layer-placement) plans as SimPy processes.

The plan's steady-state model (:func:`sim.multistage.pipeline_model`) gives
every replica's compute and message sizes; this DES executes them:

* **Work.** Each iteration's global batch is split over a stage's replicas by
  the plan's shares (replica r holds samples ``[first_r, first_r + b_r)``).
  A replica runs one forward and one backward per iteration in the 1F1B
  order: ``w_s`` forwards, then alternately the backward of the oldest
  iteration and the next forward, so stage s holds at most ``w_s``
  iterations (``in_flight``; :func:`sim.multistage.default_in_flight`). A fixed order keeps
  the traffic each stage generates smooth, which is what lets every
  resource run at the rate the steady-state model assumes (a greedy
  backward-first engine bunches forwards and backwards and idles the links
  in between). The forward of iteration k needs the activations of its
  samples from every upstream replica holding some of them (and, with
  ``job.pipeline``, its parameters); its backward needs their gradients from
  downstream (the last stage: its own forward).
* **Network.** Every replica's NIC is two FIFO links (up, down) with its
  bandwidth. The PS shards are pooled: a PS message is spread over the shards
  in proportion to their NICs, so the shards act as one up and one down link
  with the sum of their bandwidths, shared by every stage. The pool serves
  one message at a time, pre-emptive resume, in an order that keeps waiting
  off the critical path. With ``job.pipeline``, oldest iteration first: a
  prefetch for a later iteration never holds up the pull a forward is
  waiting for. Without, every PS message stalls its replica until it
  arrives, so shortest message first (which minimises the total time
  replicas stall, SRPT; datacenter transports prioritise small flows the
  same way): a stage's small pull or push is not held behind another
  stage's large ones, which would add a queueing delay the steady-state
  model does not have. Over the multi-stage plans of random_problem seeds
  0-1021 (tests/test_multistage.py's random_plans), DES against model:
  shortest first, 0 of 1,455 plans beyond 1% (max 0.87%); oldest first
  (seeds 0-1020), 3 of 1,329 beyond 2% (max 13.9%); processor sharing, 33
  beyond 2% (max 39.5%): it keeps the replicas of a stage, which sync at
  the same moment, contending in lock-step, where a one-at-a-time pool
  staggers them. A message holds the sender's up link and the receiver's
  down link, each for ``bytes / bw``
  (queued independently: a fluid cut-through approximation, so an
  uncontended message takes ``bytes / min(bw) + latency_s``, the costmodel's
  message time), then arrives ``latency_s`` after its last byte. Boundary
  messages carry ``overlap * act_out`` bytes forward from replica r of stage
  s to replica q of stage s+1 (``overlap``: samples both hold) and as many
  gradient bytes back.
* **PS sync, per stage.** Each replica pulls its stage's parameters for every
  iteration and pushes its gradients after the backward; stage s's update of
  iteration k is applied when all its replicas' pushes have arrived. The pull
  for iteration k waits for the update of iteration k - lag_s (bounded
  staleness, as in any pipeline with iterations in flight;
  :func:`sim.multistage.staleness_bound` makes it long enough for the push, the update and
  the pull to overlap the iterations in between, and issues the pull before
  the activations of the next iteration queue on the link). With
  ``job.pipeline`` pulls are prefetched and pushes sent in the background,
  FIFO with the boundary traffic (priority would starve the boundary traffic
  on a link the PS traffic nearly fills). Without, the replica waits for the
  pull before the forward and for the push after the backward: the model's
  ``(pull + push) / nic + 2 * latency`` added to the iteration; these
  messages pre-empt boundary traffic on the replica's links (which resumes
  where it stopped), as the model's sync time at the full NIC assumes.

PS aggregation and update work is not modelled (the steady-state model
charges none), so shards are never busy and their track in the trace shows
their NIC time. An iteration ends when every stage has applied its update
and every earlier iteration has ended.

Deterministic: no randomness; SimPy's (time, priority, insertion) order
fixes every tie, so the same problem and plan give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

import numpy as np
import simpy

from sim.multistage import (
    default_in_flight,
    devices_of,
    pipeline_model,
    staleness_bound,
    unsupported_note,
)
from sim.plan import Plan
from sim.problem import Problem
from sim.result import ModelSteadyState, RunResult, Trace

#: A run's throughput window holds at least this many times the fill's length in steady
#: periods. After the fill a pipeline runs off its steady rate for a while: the
#: bottleneck did work for later iterations during the fill (such as the parameters
#: prefetched for the first ``staleness_bound`` iterations), and queues the fill left on
#: near-saturated links drain. What the fill banked is at most about its length, so its
#: share of a window this long stays within about 1% of the window: a window this long
#: agrees with the steady-state model within 1% (tests/test_reports.py checks the random
#: plans of tests/test_multistage.py that stray most).
WINDOW_FILLS = 16

#: Priorities on a replica's links: a non-pipelined job's PS messages pre-empt boundary
#: traffic. (On the PS pool the priority is the iteration, oldest first, with
#: ``job.pipeline``, else the message's size, smallest first.)
_SYNC, _BULK = 0, 1
_EPS_BYTES = 1e-6


class Link:
    """One direction of a NIC (or of the PS pool): messages served one at a time at
    ``bw_Bps``, in (priority, arrival) order -- FIFO within a priority.

    A request with ``preempt`` and a better (lower) priority interrupts the
    message in service, which re-queues with the bytes it has left and keeps
    its place (pre-emptive resume).
    """

    def __init__(self, env: simpy.Environment, bw_Bps: float,
                 on_busy: Callable[[float, float], None] | None = None) -> None:
        self.env = env
        self.bw = float(bw_Bps)
        self.res = simpy.PreemptiveResource(env, capacity=1)
        self.on_busy = on_busy
        self.busy_s = 0.0
        self._seq = 0

    def send(self, nbytes: float, priority: float, preempt: bool) -> Generator[Any, Any, None]:
        env, left = self.env, float(nbytes)
        # A pre-empted message keeps its place in the queue: its key stays (class, first
        # request time, arrival number), ahead of everything of its class queued after it.
        self._seq += 1
        key = (priority, env.now, self._seq)
        while left > _EPS_BYTES:
            with self.res.request(priority=key, preempt=preempt) as req:  # type: ignore[arg-type]
                t0 = -1.0
                try:
                    yield req  # pre-emption can strike here too: granted, not yet resumed
                    t0 = env.now
                    yield env.timeout(left / self.bw)
                    left = 0.0
                except simpy.Interrupt:
                    if t0 >= 0:
                        left -= (env.now - t0) * self.bw
                if t0 >= 0:
                    self.busy_s += env.now - t0
                    if self.on_busy is not None and env.now > t0:
                        self.on_busy(t0, env.now)


class PipelineSim:
    """One DES run of a multi-stage plan. Use :func:`simulate_pipeline`."""

    def __init__(self, problem: Problem, plan: Plan, trace: bool = True,
                 on_iteration: Callable[[int], None] | None = None,
                 in_flight: Sequence[int] | None = None) -> None:
        self.problem, self.plan = problem, plan
        self.m = m = pipeline_model(problem, plan)
        self.env = env = simpy.Environment()
        self.S = S = len(m.stages)
        self.w = list(in_flight) if in_flight is not None else default_in_flight(m)
        if len(self.w) != S or min(self.w) < 1:
            raise ValueError(f"in_flight needs one count >= 1 per stage, got {self.w}")
        self.lag = staleness_bound(m, self.w)
        self.n_iter = problem.job.iterations
        self.pipelined = m.pipeline
        self.lat = m.latency_s
        self.trace = Trace() if trace else None
        self.on_iteration = on_iteration
        # replicas: (stage, index) -> global index g (trace thread, device order of the plan)
        self.g: list[list[int]] = []
        self.names: list[str] = []
        for st in m.stages:
            self.g.append(list(range(len(self.names), len(self.names) + len(st.replicas))))
            self.names.extend(r.device for r in st.replicas)
        self.up = [Link(env, r.nic_Bps) for st in m.stages for r in st.replicas]
        self.down = [Link(env, r.nic_Bps) for st in m.stages for r in st.replicas]
        cap = m.ps_capacity_Bps
        self.ps_up = Link(env, cap if cap > 0 else 1.0, self._ps_span("pull"))
        self.ps_down = Link(env, cap if cap > 0 else 1.0, self._ps_span("push"))
        # boundary pieces: for stage s, (r, q, samples) with r in s and q in s + 1
        self.pieces: list[list[tuple[int, int, int]]] = []
        for s in range(S - 1):
            a, b = m.stages[s].replicas, m.stages[s + 1].replicas
            out = []
            for r, ra in enumerate(a):
                for q, qb in enumerate(b):
                    lo = max(ra.first_sample, qb.first_sample)
                    hi = min(ra.first_sample + ra.batch, qb.first_sample + qb.batch)
                    if hi > lo:
                        out.append((r, q, hi - lo))
            self.pieces.append(out)
        # per replica: the pieces it sends forward (to replica q of the next stage) and
        # backward (to replica p of the previous one), and how many it receives of each
        reps = [range(len(st.replicas)) for st in m.stages]
        self.fwd_to = [[[(q, n) for r2, q, n in self.pieces[s] if r2 == r] if s < S - 1 else []
                        for r in reps[s]] for s in range(S)]
        self.bwd_to = [[[(p, n) for p, q, n in self.pieces[s - 1] if q == r] if s > 0 else []
                        for r in reps[s]] for s in range(S)]
        self.n_in = [[len(self.bwd_to[s][r]) for r in reps[s]] for s in range(S)]
        self.n_out = [[len(self.fwd_to[s][r]) for r in reps[s]] for s in range(S)]
        self.events: dict[tuple[str, int, int, int], simpy.Event] = {}
        self.counts: dict[tuple[str, int, int, int], int] = {}
        self.pushed: dict[tuple[int, int], int] = {}
        self.stage_done: dict[int, int] = {}
        self.complete: set[int] = set()
        self.iter_end: list[float] = []
        self.finished = env.event()
        self.compute_s = [0.0] * len(self.names)
        self.comm_s = [0.0] * len(self.names)
        self.shard_ids = list(plan.ps_shards)

    # ------------------------------------------------------------------ helpers
    def _ev(self, kind: str, s: int, r: int, k: int) -> simpy.Event:
        key = (kind, s, r, k)
        ev = self.events.get(key)
        if ev is None:
            ev = self.events[key] = self.env.event()
        return ev

    def _wait(self, kind: str, s: int, r: int, k: int) -> Generator[Any, Any, None]:
        """Wait for an event that has one waiter, then forget it."""
        yield self._ev(kind, s, r, k)
        del self.events[(kind, s, r, k)]

    def _arrive(self, kind: str, s: int, r: int, k: int, need: int) -> None:
        key = (kind, s, r, k)
        n = self.counts.get(key, 0) + 1
        if n >= need:
            self.counts.pop(key, None)
            self._ev(kind, s, r, k).succeed()
        else:
            self.counts[key] = n

    def _ps_span(self, what: str) -> Callable[[float, float], None] | None:
        if self.trace is None:
            return None

        def cb(t0: float, t1: float) -> None:
            assert self.trace is not None
            for i, sid in enumerate(self.shard_ids):
                self.trace.span("ps", i, sid, what, t0, t1)
        return cb

    def _message(self, links: tuple[Link, Link], nbytes: float, priority: int, preempt: bool,
                 label: str, owner: int, k: int = 0) -> Generator[Any, Any, None]:
        """Send ``nbytes`` over (sender up, receiver down); returns on arrival."""
        if nbytes <= 0:
            return
        env = self.env
        t0 = env.now
        a, b = (env.process(ln.send(nbytes, k if self.pipelined else nbytes, True) if ln is self.ps_up or ln is self.ps_down
                            else ln.send(nbytes, priority, preempt))
                for ln in links)
        yield a & b
        if self.lat > 0:
            yield env.timeout(self.lat)
        if self.trace is not None:
            self.trace.async_span("network", owner, self.names[owner], label, t0, env.now)

    def _send(self, links: tuple[Link, Link], nbytes: float, label: str, owner: int,
              done: Callable[[], None], k: int = 0) -> None:
        """Send in the background, FIFO; ``done`` on arrival."""
        def proc() -> Generator[Any, Any, None]:
            yield from self._message(links, nbytes, _BULK, False, label, owner, k)
            done()
        self.env.process(proc())

    # --------------------------------------------------------------- processes
    def _puller(self, s: int, r: int) -> Generator[Any, Any, None]:
        """With ``job.pipeline``: prefetch the parameters of every iteration, each as soon
        as its update is applied (the first ``lag_s`` one after another). Pulls in flight
        overlap: a chain of one pull at a time would trail the activations queued on a
        busy link by a little more every iteration."""
        lag = self.lag[s]
        prev: simpy.Process | None = None
        for k in range(self.n_iter):
            if k >= lag:
                yield self._ev("update", s, 0, k - lag)
            elif prev is not None:
                yield prev
            prev = self.env.process(self._pull(s, r, k))

    def _pull(self, s: int, r: int, k: int) -> Generator[Any, Any, None]:
        g = self.g[s][r]
        rc = self.m.stages[s].replicas[r]
        yield from self._message((self.ps_up, self.down[g]), rc.pull_bytes, _BULK, False, f"pull {k}", g, k)
        self._ev("params", s, r, k).succeed()

    def _replica(self, s: int, r: int) -> Generator[Any, Any, None]:
        """The replica's 1F1B sequence: w_s forwards, then backward k and forward k + w_s."""
        n, w = self.n_iter, min(self.w[s], self.n_iter)
        for k in range(w):
            yield from self._forward(s, r, k)
        for k in range(n):
            yield from self._backward(s, r, k)
            if k + w < n:
                yield from self._forward(s, r, k + w)

    def _forward(self, s: int, r: int, k: int) -> Generator[Any, Any, None]:
        env = self.env
        st = self.m.stages[s]
        rc = st.replicas[r]
        g = self.g[s][r]
        tr = self.trace
        if self.n_in[s][r]:
            yield from self._wait("act", s, r, k)
        if self.pipelined:
            if rc.pull_bytes > 0:
                yield from self._wait("params", s, r, k)
        elif rc.pull_bytes > 0:
            lag = self.lag[s]
            if k >= lag:
                yield self._ev("update", s, 0, k - lag)
            t0 = env.now
            yield from self._message((self.ps_up, self.down[g]), rc.pull_bytes, _SYNC, True, f"pull {k}", g, k)
            self.comm_s[g] += env.now - t0
            if tr is not None:
                tr.span("workers", g, self.names[g], f"pull {k}", t0, env.now)
        t0 = env.now
        yield env.timeout(rc.fwd_s)
        self.compute_s[g] += rc.fwd_s
        if tr is not None:
            tr.span("workers", g, self.names[g], f"fwd {k}", t0, env.now)
        for q, n in self.fwd_to[s][r]:
            self._send((self.up[g], self.down[self.g[s + 1][q]]), n * st.act_out, f"act {k}", g,
                       partial(self._arrive, "act", s + 1, q, k, self.n_in[s + 1][q]))

    def _backward(self, s: int, r: int, k: int) -> Generator[Any, Any, None]:
        env = self.env
        st = self.m.stages[s]
        rc = st.replicas[r]
        g = self.g[s][r]
        tr = self.trace
        if self.n_out[s][r]:
            yield from self._wait("grad", s, r, k)
        t0 = env.now
        yield env.timeout(rc.bwd_s)
        self.compute_s[g] += rc.bwd_s
        if tr is not None:
            tr.span("workers", g, self.names[g], f"bwd {k}", t0, env.now)
        for p, n in self.bwd_to[s][r]:
            self._send((self.up[g], self.down[self.g[s - 1][p]]), n * st.act_in, f"grad {k}", g,
                       partial(self._arrive, "grad", s - 1, p, k, self.n_out[s - 1][p]))
        if rc.push_bytes <= 0:
            self._pushed(s, k)
        elif self.pipelined:
            self._send((self.up[g], self.ps_down), rc.push_bytes, f"push {k}", g, lambda: self._pushed(s, k), k)
        else:
            t0 = env.now
            yield from self._message((self.up[g], self.ps_down), rc.push_bytes, _SYNC, True, f"push {k}", g, k)
            self.comm_s[g] += env.now - t0
            if tr is not None:
                tr.span("workers", g, self.names[g], f"push {k}", t0, env.now)
            self._pushed(s, k)

    def _pushed(self, s: int, k: int) -> None:
        key = (s, k)
        n = self.pushed.get(key, 0) + 1
        if n < len(self.m.stages[s].replicas):
            self.pushed[key] = n
            return
        self.pushed.pop(key, None)
        self._ev("update", s, 0, k).succeed()
        # every replica has pushed k, so its forward k and pull k (which waited for update
        # k - lag) are behind it: nothing waits for that update any more
        self.events.pop(("update", s, 0, k - self.lag[s]), None)
        done = self.stage_done.get(k, 0) + 1
        self.stage_done[k] = done
        if done == self.S:
            del self.stage_done[k]
            self.complete.add(k)
            while len(self.iter_end) in self.complete:
                self.complete.discard(len(self.iter_end))
                self.iter_end.append(self.env.now)
                if self.on_iteration is not None:
                    self.on_iteration(len(self.iter_end))
            if len(self.iter_end) >= self.n_iter and not self.finished.triggered:
                self.finished.succeed()

    # --------------------------------------------------------------------- run
    def run(self) -> RunResult:
        env, m = self.env, self.m
        for s, st in enumerate(m.stages):
            for r, rc in enumerate(st.replicas):
                if self.pipelined and rc.pull_bytes > 0:
                    env.process(self._puller(s, r))
                env.process(self._replica(s, r))
        env.run(until=self.finished)
        return self._result(env.now)

    def _result(self, end: float) -> RunResult:
        job = self.problem.job
        compute = dict(zip(self.names, self.compute_s))
        comm = dict(zip(self.names, self.comm_s))
        extra: dict[str, Any] = {
            "in_flight": list(self.w),
            "staleness_bound": list(self.lag),
            "steady_throughput_sps": steady_throughput(self.iter_end, job.global_batch, self.w[0]),
        }
        note = unsupported_note(self.problem)
        if note:
            extra["note"] = note
        if self.trace is not None and self.trace.dropped:
            extra["trace_events_dropped"] = self.trace.dropped
        n = len(self.iter_end)
        fills = self.iter_end[0] / self.m.period_s if n and self.m.period_s > 0 else 1.0
        win = steady_window(n, self.w, self.lag, fills, job.warmup_iterations)
        model = None
        if win is None:
            need = min_steady_iterations(self.w, self.lag, fills, job.warmup_iterations)
            model = ModelSteadyState(
                self.m.throughput_sps, self.m.period_s, need,
                f"{self.plan.scheduler}: {n} iterations are too few to measure this pipeline's "
                f"steady state (its fill takes {fills:.3g} steady periods, {max(self.w)} iterations in flight); "
                f"throughput is the steady-state model's; run at least {need} iterations to measure it")
        first, last = win if win is not None else (min(self.w[0], max(n - 1, 0)), n)
        return RunResult(
            name=self.problem.name, evaluator="des", scheduler=self.plan.scheduler, seed=self.problem.seed,
            iter_end_s=list(self.iter_end), iter_samples=[job.global_batch] * n,
            devices=devices_of(self.problem, self.plan, compute, comm, end),
            warmup=first, drain=n - last, model_steady=model, extra=extra,
            trace=self.trace.events if self.trace is not None else [],
        )


def steady_window(n: int, in_flight: Sequence[int], lag: Sequence[int], fill_periods: float,
                  warmup: int = 0) -> tuple[int, int] | None:
    """The throughput window ``[first, stop)`` of an ``n``-iteration run, or None when
    the run is too short to have one.

    The drain is the last ``max(in_flight)`` iterations: stage s runs no forward for
    its last ``in_flight[s]`` iterations, so they end faster than the steady period.
    The window starts in the second half of the run, after every stage's first pull
    that waits for an update (iteration ``max(lag)``) and after the job's warm-up,
    and holds at least ``WINDOW_FILLS`` times the fill (``fill_periods``: the first
    iteration's time over the steady period).
    """
    depth = max(in_flight)
    first = max(max(lag) + 1, n // 2, warmup)
    stop = n - depth
    return (first, stop) if stop - first >= _window_length(fill_periods) else None


def min_steady_iterations(in_flight: Sequence[int], lag: Sequence[int], fill_periods: float,
                          warmup: int = 0) -> int:
    """The shortest run that has a throughput window (:func:`steady_window`)."""
    need = _window_length(fill_periods) + max(in_flight)  # iterations from the window's first on
    return max(2 * need - 1, need + max(max(lag) + 1, warmup))


def _window_length(fill_periods: float) -> int:
    return max(math.ceil(WINDOW_FILLS * fill_periods - 1e-9), 1)


def steady_throughput(iter_end_s: list[float], batch: int, skip: int) -> float:
    """Samples/s in steady state: ``batch`` over the least-squares slope of the
    end times of the second half of the iterations, less the last ``skip``
    (the drain; fewer if the run is short). The first half covers the fill
    and the transient while queues that the fill left on near-saturated links
    drain (that can take many iterations when a link runs at 95 %); the slope
    averages out the periodic pattern in which iterations complete."""
    n = len(iter_end_s)
    skip = min(skip, max((n - 4) // 2, 0))
    ends = np.asarray(iter_end_s[max(skip, n // 2):n - skip], dtype=float)
    if ends.size < 2:
        return batch / iter_end_s[-1] if n and iter_end_s[-1] > 0 else 0.0
    x = np.arange(ends.size, dtype=float)
    slope = float(np.polyfit(x, ends, 1)[0])
    return batch / slope if slope > 0 else 0.0


def simulate_pipeline(problem: Problem, plan: Plan, trace: bool = True,
                      on_iteration: Callable[[int], None] | None = None,
                      in_flight: Sequence[int] | None = None) -> RunResult:
    """Run a multi-stage ``plan`` for ``problem.job.iterations`` iterations.

    Args:
        trace: record a Chrome trace (one thread per replica and shard).
        on_iteration: called with the number of iterations done after each one.
        in_flight: iterations each stage holds at once (default
            :func:`default_in_flight`); with one more, the PS staleness bound.

    The result's throughput covers :func:`steady_window`, which leaves out the fill
    and the drain; a run too short to have that window reports the steady-state
    model's throughput (:func:`sim.multistage.pipeline_model`) and says so
    (``throughput_window`` in the summary, with the iterations it would need).
    ``extra["steady_throughput_sps"]`` is the run's own least-squares estimate
    (:func:`steady_throughput`).
    """
    return PipelineSim(problem, plan, trace=trace, on_iteration=on_iteration, in_flight=in_flight).run()
