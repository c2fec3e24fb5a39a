"""The DES of an all-reduce plan (``job.sync: allreduce``): workers as SimPy processes,
one communicator reducing the buckets in order (the model of :mod:`sim.collective`).

A worker computes its forward, then its backward bucket by bucket (pipeline: each
bucket is ready when backward reaches it; else every bucket at the backward's end),
waits until the iteration's last bucket is reduced, then unpacks and applies the
update (its optimizer step) and starts the next iteration. The communicator starts
bucket k once every member has it ready and bucket k - 1 is reduced; it lasts
:meth:`sim.collective.CollectiveCosts.comm_s` of the members. Without dynamics this is
the closed form's recursion (:mod:`sim.collective_analytic`), event by event.

Members are the workers not known to have failed; a worker with share 0 computes
nothing but still joins every all-reduce (its gradient is zero) and applies the
update, so it stays in step for when it gets work again.

Dynamics: a slowdown stretches compute from its time on (a compute in progress is
stretched for what is left of it); a failed worker stops at once. Its failure is
detected ``job.failure_timeout_s`` later: from then on it is no member, and an
iteration whose reduction it held up starts its reduction over, from the first
bucket, among the survivors (their gradients are ready; a collective in flight that
included the dead worker is abandoned), as the runtime re-forms its group and redoes
the iteration's all-reduce. Without an online scheduler its share is lost (the
global batch shrinks, as in the PS DES).

Online scheduling: when iteration t ends (its last member has applied the update),
the scheduler's ``rebalance`` gets an Observation of the window since its last call,
and each worker takes the plan it returns from iteration t + 2 on, as the runtime's
coordinator does (it sends each iteration's word two iterations ahead, so that no
worker waits for it).

Hosts (``cluster.hosts``): a hosted worker's compute is a flow on its host's cores
(:class:`sim.des.hosts.HostCPU`), and each bucket's all-reduce costs every hosted
member CPU on the same cores: its copies in and out of the transport, on a copier
process of one thread (as the PS DES charges a message's copies), for the bytes a
ring member sends and receives, ``2 (n - 1) / n`` of the bucket each way, at the host's
``copy_Bps``, beside its summing of the ``(n - 1) / n`` of the bucket it reduces
(memory-bound, :data:`REDUCE_PASSES` passes at its profile's bandwidth). A bucket's
all-reduce then ends when both its alpha-beta time and every member's CPU are done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import simpy

from sim.cluster import Placement
from sim.collective import CollectiveCosts, collective_costs, run_notes
from sim.convergence import model_tensor_elems
from sim.des.hosts import HostCPU
from sim.des.kernel import Environment, call_later
from sim.des.kernel import run as run_until
from sim.des.noise import noise_factors
from sim.des.state import TARGET_CAP, rare_gc
from sim.emulation import RuntimeEmulation, emulated_problem
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.plan import Plan, PlanKind, require_kind
from sim.problem import Problem
from sim.result import DeviceUsage, RunResult, Trace
from sim.scheduling import OnlineScheduler

#: Memory passes of a ring member's reduction per byte it reduces: read both addends, write the sum.
REDUCE_PASSES = 3.0


def simulate(problem: Problem, plan: Plan, trace: bool = True,
             on_iteration: Callable[[int], None] | None = None, scheduler: Any = None,
             emulation: RuntimeEmulation | None = None) -> RunResult:
    """Run the all-reduce ``plan`` for ``problem.job.iterations`` iterations in the DES.

    Deterministic: the same problem and plan give the same result, byte for byte.
    Arguments as :func:`sim.des.simulate` (of ``emulation``, this DES models the
    problem part and each hosted worker's CPU scales).
    """
    require_kind(plan, PlanKind.DATA_PARALLEL, "sim.des.collective.simulate")
    return AllreduceSim(emulated_problem(problem, emulation), plan, trace=trace, on_iteration=on_iteration,
                        scheduler=scheduler, emulation=emulation).run()


class _Worker:
    """A worker's state: its cost rows, status and time split."""

    __slots__ = ("batch", "fwd", "segs", "opt", "next", "slow", "alive", "noise", "compute", "comm",
                 "wait", "blocked_at", "win_compute", "win_samples", "free_frac", "computing", "proc",
                 "flow", "cpu", "copier", "end")

    def __init__(self) -> None:
        self.batch = 0
        self.fwd = 0.0
        self.segs: list[float] = []  # backward: one piece per bucket, then what is left
        self.opt = 0.0
        self.next: dict[int, tuple[int, float, list[float], float]] = {}  # iteration -> rows from then on
        self.slow = 1.0
        self.alive = True
        self.noise: Iterator[float] | None = None
        self.compute = self.comm = self.wait = 0.0
        self.blocked_at = 0.0
        self.win_compute = 0.0
        self.win_samples = 0
        self.free_frac = 1.0
        self.computing = False
        self.proc: simpy.Process | None = None
        self.flow: Any = None  # its host compute in progress
        self.cpu: int | None = None  # process id on the HostCPU (None: not hosted)
        self.copier: int | None = None  # its copier's process id (hosts with copy_Bps)
        self.end = 0.0  # when its last optimizer step ended


def _rows(c: CollectiveCosts, w: int) -> tuple[int, float, list[float], float]:
    """Worker w's (share, forward, backward pieces, unpack + step) from ``c``."""
    ready = c.ready_s[w].tolist()
    bwd = float(c.bwd_s[w])
    segs = [b - a for a, b in zip([0.0, *ready], ready)] + [bwd - (ready[-1] if ready else 0.0)]
    return int(c.batch[w]), float(c.fwd_s[w]), segs, float(c.opt_s[w])


class AllreduceSim:
    """One DES run of an all-reduce plan. Use :func:`simulate`."""

    def __init__(self, problem: Problem, plan: Plan, trace: bool = True,
                 on_iteration: Callable[[int], None] | None = None, scheduler: Any = None,
                 emulation: RuntimeEmulation | None = None) -> None:
        self.problem, self.plan = problem, plan
        self.emulation = emulation or RuntimeEmulation()
        self.c = c = collective_costs(problem, plan, stretch_hosts=False)
        self.env = Environment()
        job = problem.job
        self.N, self.K = N, K = len(c.workers), c.n_buckets
        self.n_iter = job.iterations
        self.trace = Trace() if trace else None
        self.on_iteration = on_iteration
        self.w = [_Worker() for _ in range(N)]
        index = {d.id: i for i, d in enumerate(problem.cluster.devices)}
        rel = dict(zip((d.id for d in problem.cluster.devices), job.compute_noise))
        for i, (wk, dev) in enumerate(zip(self.w, c.workers)):
            wk.batch, wk.fwd, wk.segs, wk.opt = _rows(c, i)
            if rel.get(dev, 0.0) > 0:
                wk.noise = noise_factors(problem.seed, index[dev], rel[dev])
        self._hosts()
        # the communicator: members, buckets marked ready this round, the bucket next due,
        # whether one is in flight (its round: a failure's restart abandons it)
        self.members = set(range(N))
        self.member_ids = tuple(range(N))  # the members in order (changes only in _leave)
        self.marked: list[set[int]] = [set() for _ in range(max(K, 1))]
        self.next_k = 0
        self.inflight = False
        self.round = 0
        self.spans: list[tuple[float, float]] = []  # this iteration's all-reduces (start, end)
        self.reduced = self.env.event()
        self.it = 0  # the iteration whose reduction is under way
        self.iter_end: list[float] = []
        self.iter_samples: list[int] = []
        self.ended: set[int] = set()  # members whose step of the current iteration is done
        self.samples_now = 0
        self.failures: list[dict[str, Any]] = []
        self.finished = self.env.event()
        self.incomplete = ""
        self.rebalance_fn = scheduler.rebalance if isinstance(scheduler, OnlineScheduler) else None
        self.plan_now = plan
        self.rebalances = 0
        self.conv = job.convergence
        self.eff_samples = 0.0
        self.time_to_target: float | None = None
        self.iter_loss: list[float] = []
        if self.conv is not None:
            self.tensor_elems = model_tensor_elems(job.model)
        self.eff_target = None
        if job.target_loss is not None and self.conv is not None:
            self.n_iter = job.iterations * TARGET_CAP
            self.eff_target = self.conv.effective_to_target(job.target_loss)

    def _hosts(self) -> None:
        """Hosted workers' processes (and their copiers) on a :class:`HostCPU`."""
        cl, N = self.problem.cluster, self.N
        placed = [cl.placed(d) for d in self.c.workers]
        self.cpu: HostCPU | None = None
        if all(pl is None for pl in placed):
            return
        procs: list[Placement] = []
        scales: list[float] = []
        for wk, pl, dev in zip(self.w, placed, self.c.workers):
            if pl is not None:
                wk.cpu = len(procs)
                procs.append(pl)
                scales.append(self.emulation.cpu_scale(dev).compute)
        for wk, pl, dev in zip(self.w, placed, self.c.workers):
            if pl is not None and cl.hosts[pl.host].copy_Bps > 0:
                wk.copier = len(procs)
                procs.append(dataclasses.replace(pl, threads=1))
                s = self.emulation.cpu_scale(dev)
                scales.append(s.compute * s.copies)
        self.cpu = HostCPU(self.env, cl.hosts, procs, scales)
        self.copy_s_per_B = [1.0 / cl.hosts[pl.host].copy_Bps if pl is not None and cl.hosts[pl.host].copy_Bps > 0
                             else 0.0 for pl in placed]
        self.reduce_s_per_B = [REDUCE_PASSES / cl.device(d).type.mem_bw_Bps for d in self.c.workers]
        assert len(placed) == N

    # ------------------------------------------------------------------ compute
    def _compute(self, w: int, work_s: float) -> Any:
        """``work_s`` seconds of nominal compute at worker w's slowdown (a slowdown that
        changes midway stretches what is left), or on its host's cores."""
        if work_s <= 0:
            return
        wk = self.w[w]
        if wk.cpu is not None:
            yield from self._host_compute(w, work_s)
            return
        env = self.env
        wk.computing = True
        try:
            while True:
                t0, slow = env.now, wk.slow
                try:
                    yield env.timeout(work_s * slow)
                    return
                except simpy.Interrupt as e:
                    if e.cause != "slowdown":
                        raise
                    work_s -= (env.now - t0) / slow
        finally:
            wk.computing = False

    def _host_compute(self, w: int, work_s: float) -> Any:
        """On the host's cores at the worker's fair share; a slowdown f > 1 then sleeps
        (f - 1) x the elapsed compute, as the runtime emulates it (see
        :meth:`sim.des.engine.DataParallelSim._host_compute`)."""
        env, cpu, wk = self.env, self.cpu, self.w[w]
        assert cpu is not None and wk.cpu is not None
        t0, slow = env.now, wk.slow
        done = env.event()
        wk.flow = cpu.compute(wk.cpu, work_s * min(slow, 1.0), done.succeed)  # type: ignore[arg-type]
        try:
            yield done
        except simpy.Interrupt:  # failed: its work stops competing for the cores
            if wk.flow is not None:
                cpu.cancel(wk.flow)
            raise
        finally:
            wk.flow = None
        if slow > 1.0:
            yield env.timeout((slow - 1.0) * (env.now - t0))

    def _timed(self, w: int, work_s: float, label: str) -> Any:
        """A compute of worker w, counted and traced."""
        t0 = self.env.now
        yield from self._compute(w, work_s)
        self.w[w].compute += self.env.now - t0
        if self.trace is not None and self.env.now > t0:
            self.trace.span("workers", w, self.c.workers[w], label, t0, self.env.now)

    # ------------------------------------------------------------------ workers
    def _worker(self, w: int) -> Any:
        env, wk, K = self.env, self.w[w], self.K
        try:
            for it in range(self.n_iter):
                if self.finished.triggered:
                    break
                if it in wk.next:
                    wk.batch, wk.fwd, wk.segs, wk.opt = wk.next.pop(it)
                k = next(wk.noise) if wk.noise is not None else 1.0
                t0 = env.now
                reduced = self.reduced  # this iteration's: it cannot end before w's marks
                if wk.batch > 0:
                    yield from self._timed(w, wk.fwd * k, "fwd")
                for b in range(K):
                    if wk.batch > 0:
                        yield from self._timed(w, wk.segs[b] * k, f"bwd b{b}")
                    self._mark(w, b)
                if wk.batch > 0:
                    yield from self._timed(w, wk.segs[K] * k, "bwd")
                    wk.win_compute += env.now - t0
                    wk.win_samples += wk.batch
                if K == 0:
                    self._mark(w, 0)
                wk.blocked_at = env.now
                yield reduced
                yield from self._timed(w, wk.opt, "step")
                wk.end = env.now
                self._ended(w, it)
        except simpy.Interrupt:  # failed
            return

    def _mark(self, w: int, b: int) -> None:
        """Worker w's gradients of bucket b are ready (packed)."""
        self.marked[b].add(w)
        self._try_start()

    # -------------------------------------------------------------- communicator
    def _try_start(self) -> None:
        """Start the bucket next due if every member has it ready and none is in flight."""
        gates = max(self.K, 1)
        # marked sets and ended hold members only (_leave discards a leaver): counts decide
        if self.inflight or self.next_k >= gates or len(self.marked[self.next_k]) < len(self.members):
            return
        k, members = self.next_k, self.member_ids
        dur = float(self.c.comm_s(members)[k]) if self.K else 0.0
        self.inflight = True
        tag, t0 = self.round, self.env.now
        parts = 1
        if self.cpu is not None and self.K and len(members) > 1:
            parts += self._host_parts(k, members, lambda: done())

        def done() -> None:
            nonlocal parts
            parts -= 1
            if parts == 0:
                self._reduced_bucket(k, tag, t0)

        call_later(self.env, dur, lambda _e: done())

    def _host_parts(self, k: int, members: tuple[int, ...], done: Callable[[], None]) -> int:
        """Each hosted member's CPU for bucket k's all-reduce (see the module docstring),
        as flows on its copier (copies) and its own process (the reduction); returns how
        many were started (each calls ``done`` when finished)."""
        cpu, n = self.cpu, len(members)
        assert cpu is not None
        nbytes = self.c.buckets[k].wire_bytes
        moved = 2 * (n - 1) / n * nbytes  # sent, and as much received
        reduced = (n - 1) / n * nbytes
        started = 0
        for w in members:
            wk = self.w[w]
            if wk.copier is not None:
                cpu.compute(wk.copier, 2 * moved * self.copy_s_per_B[w], done)
                started += 1
            if wk.cpu is not None and wk.alive:
                cpu.compute(wk.cpu, reduced * self.reduce_s_per_B[w], done)
                started += 1
        return started

    def _reduced_bucket(self, k: int, tag: int, t0: float) -> None:
        if tag != self.round:  # abandoned: a member's failure restarted the reduction
            return
        now = self.env.now
        self.inflight = False
        self.spans.append((t0, now))
        if self.trace is not None and self.K:
            for w in self.member_ids:
                self.trace.span("network", w, self.c.workers[w], f"allreduce b{k}", t0, now)
        self.next_k += 1
        if self.next_k < max(self.K, 1):
            self._try_start()
            return
        # the iteration's reduction is done: its samples are the members' shares
        self.samples_now = sum(self.w[w].batch for w in self.members)
        for w in self.members:
            self._release(w, now)
        self.marked = [set() for _ in range(max(self.K, 1))]
        self.next_k = 0
        self.spans = []
        ev, self.reduced = self.reduced, self.env.event()
        ev.succeed()

    def _release(self, w: int, now: float) -> None:
        """Worker w's wait for the reduction ends: the part with an all-reduce in flight
        is its communication, the rest waiting for the others."""
        wk = self.w[w]
        inflight = sum(max(0.0, min(b, now) - max(a, wk.blocked_at)) for a, b in self.spans)
        wk.comm += inflight
        wk.wait += (now - wk.blocked_at) - inflight

    def _ended(self, w: int, it: int) -> None:
        """Worker w has applied iteration ``it``'s update; the iteration ends with the last member's."""
        self.ended.add(w)
        if len(self.ended) < len(self.members):
            return
        self.ended = set()
        self._end_iteration(self.samples_now)

    def _end_iteration(self, samples: int) -> None:
        now = self.env.now
        self.iter_end.append(now)
        self.iter_samples.append(samples)
        if self.conv is not None:
            self.eff_samples += self.conv.effective_samples(samples, samples, 0.0, self.problem.job.quant_bits,
                                                            self.tensor_elems)
            self.iter_loss.append(float(self.conv.loss(self.eff_samples)))
            if (self.eff_target is not None and self.time_to_target is None
                    and self.eff_samples >= self.eff_target * (1 - 1e-9)):
                self.time_to_target = now
        if self.on_iteration is not None:
            self.on_iteration(len(self.iter_end))
        if (len(self.iter_end) >= self.n_iter or self.time_to_target is not None) and not self.finished.triggered:
            self.finished.succeed()
        if self.rebalance_fn is not None and not self.finished.triggered:
            self._rebalance(len(self.iter_end) + 1)

    # ----------------------------------------------------------------- dynamics
    def _slowdown(self, w: int, at_s: float, factor: float) -> Any:
        yield self.env.timeout(at_s)
        wk = self.w[w]
        wk.slow = factor
        if wk.computing and wk.alive and wk.proc is not None:
            wk.proc.interrupt("slowdown")

    def _failure(self, w: int, at_s: float) -> Any:
        yield self.env.timeout(at_s)
        wk = self.w[w]
        if not wk.alive or self.finished.triggered:
            return
        wk.alive = False
        if wk.proc is not None and wk.proc.is_alive:
            wk.proc.interrupt("fail")
        failed_at = self.env.now
        rec = {"worker": self.c.workers[w], "failed_at_s": failed_at, "detected_at_s": None, "lost_s": None}
        self.failures.append(rec)
        yield self.env.timeout(self.problem.job.failure_timeout_s)
        rec["detected_at_s"] = self.env.now
        rec["lost_s"] = self.env.now - failed_at
        self._leave(w)

    def _leave(self, w: int) -> None:
        """A detected failure: w is no member; a reduction it was part of starts over."""
        self.members.discard(w)
        self.member_ids = tuple(sorted(self.members))
        self.ended.discard(w)
        if not self.members:
            return
        if self.next_k > 0 or self.inflight:
            # the collective of this iteration had w in its group: redo it among the survivors
            self.round += 1
            self.inflight = False
            self.next_k = 0
            self.spans = [(a, min(b, self.env.now)) for a, b in self.spans]
        for m in self.marked:
            m.discard(w)
        self._try_start()
        if len(self.ended) == len(self.members):  # it held up the end of an iteration only
            self.ended = set()
            self._end_iteration(self.samples_now)

    def _free_memory(self, w: int, at_s: float, frac: float) -> Any:
        yield self.env.timeout(at_s)
        self.w[w].free_frac = frac

    # ---------------------------------------------------------- online scheduling
    def observation(self) -> Observation:
        """The Observation of the window since the previous rebalance call."""
        cl = self.problem.cluster
        share = {r.device: r.batch for r in self.plan_now.replicas}
        ws = tuple(
            WorkerStatus(device=dev, batch=share.get(dev, 0), compute_s=wk.win_compute, samples=wk.win_samples,
                         rate_sps=rate_sps(wk.win_samples, wk.win_compute),
                         free_memory_bytes=cl.device(dev).type.memory_bytes * wk.free_frac,
                         alive=w in self.members)
            for w, (dev, wk) in enumerate(zip(self.c.workers, self.w)))
        return Observation(self.env.now, len(self.iter_end), ws, self.problem.job.global_batch)

    def _rebalance(self, start: int) -> None:
        """Call the scheduler; the plan it returns is each worker's from iteration ``start`` on."""
        assert self.rebalance_fn is not None
        obs = self.observation()
        for wk in self.w:
            wk.win_compute, wk.win_samples = 0.0, 0
        new = self.rebalance_fn(full_membership(self.plan_now, self.c.workers), obs)
        if new is None:
            return
        shares = accepted_shares(new, obs, self.problem.job.global_batch)
        full = full_membership(new, self.c.workers, shares)
        costs = collective_costs(self.problem, full, stretch_hosts=False)
        for w, wk in enumerate(self.w):
            wk.next[start] = _rows(costs, w)
        self.plan_now = full
        self.rebalances += 1

    # --------------------------------------------------------------------- run
    def run(self) -> RunResult:
        env = self.env
        index = {dev: w for w, dev in enumerate(self.c.workers)}
        with rare_gc():
            for w, wk in enumerate(self.w):
                wk.proc = env.process(self._worker(w))
            for d in self.problem.dynamics:
                wi = index.get(self.problem.cluster.devices[d.worker].id)
                if wi is None:
                    continue  # that device is not in the plan
                if d.fail:
                    env.process(self._failure(wi, d.at_s))
                elif d.slowdown is not None:
                    env.process(self._slowdown(wi, d.at_s, d.slowdown))
                if d.free_memory_frac is not None:
                    env.process(self._free_memory(wi, d.at_s, d.free_memory_frac))
            try:
                run_until(env, self.finished)
            except RuntimeError:
                if self.members:
                    raise RuntimeError(f"DES stalled at t={env.now} after {len(self.iter_end)} of "
                                       f"{self.n_iter} iterations") from None
                self.incomplete = f"every worker failed: {len(self.iter_end)} of {self.n_iter} iterations completed"
        return self._result(env.now)

    def _result(self, end: float) -> RunResult:
        cl, job = self.problem.cluster, self.problem.job
        devices = []
        for dev_id, wk in zip(self.c.workers, self.w):
            t = cl.device(dev_id).type
            idle = max(0.0, end - wk.compute - wk.comm - wk.wait)  # after its last step, or dead
            devices.append(DeviceUsage(dev_id, "worker", t.price_per_hour, t.power_w.idle, t.power_w.active,
                                       busy_s=wk.compute, compute_s=wk.compute, comm_s=wk.comm,
                                       wait_s=wk.wait + idle))
        extra: dict[str, Any] = run_notes(self.c)
        if self.incomplete:
            extra["incomplete"] = self.incomplete
        if self.eff_target is not None and self.conv is not None and self.time_to_target is None:
            extra["target_not_reached"] = (
                f"loss {self.conv.loss(self.eff_samples):.6g} > target {job.target_loss} after "
                f"{len(self.iter_end)} iterations (cap: {TARGET_CAP} x the {job.iterations} BSP needs)")
        if self.trace is not None and self.trace.dropped:
            extra["trace_events_dropped"] = self.trace.dropped
        if self.rebalance_fn is not None:
            extra["rebalances"] = self.rebalances
            extra["final_shares"] = {r.device: r.batch for r in self.plan_now.replicas}
        if self.cpu is not None:
            cpu_s: dict[str, float] = {}
            for dev_id, wk in zip(self.c.workers, self.w):
                if wk.cpu is not None:
                    cpu_s[dev_id] = self.cpu.cpu_s[wk.cpu]
                if wk.copier is not None:
                    cpu_s[f"{dev_id} transport"] = self.cpu.cpu_s[wk.copier]
            extra["host_cpu_s"] = cpu_s
        return RunResult(
            name=self.problem.name, evaluator="des", scheduler=self.plan.scheduler, seed=self.problem.seed,
            iter_end_s=list(self.iter_end), iter_samples=list(self.iter_samples), devices=devices,
            warmup=job.warmup_iterations, failures=self.failures, extra=extra,
            trace=self.trace.events if self.trace is not None else [], time_to_target_s=self.time_to_target,
            iter_loss=list(self.iter_loss) if self.conv is not None else None,
        )
