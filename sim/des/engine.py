"""The data-parallel PS training job as SimPy processes.

Workers are processes (forward/backward as timeouts, one per layer group);
messages go through :class:`FlowNetwork`; shards aggregate and apply on a
:class:`ShardServer`. The synchronisation modes differ only in when a
worker's pull of a chunk may start and when a shard applies:

* BSP: a shard applies chunk c once every live worker's gradient of the
  current iteration has arrived (aggregated on arrival), then sends the new
  parameters to every worker. The iteration ends when every chunk is applied.
* ASP: a shard applies each worker's gradient on arrival and sends that
  worker the fresh chunk; no one waits for anyone.
* SSP(s): as ASP, but a worker may start iteration k only when the slowest
  live worker has finished iteration k - s - 1.

For ASP and SSP a "global iteration" ends each time another global batch of
samples has been applied.

Online scheduling (the seam of ARCHITECTURE.md): given an
:class:`~sim.scheduling.OnlineScheduler`, the engine calls its ``rebalance`` at the end of every global
iteration with an :class:`~sim.observation.Observation` measured over the
iterations since the previous call, and applies the plan it returns. The
worker set stays fixed; a worker takes its new share from the next iteration
it starts (BSP: when its first layer group's parameters have arrived; ASP/SSP:
at the top of its loop), and everything of that iteration - compute, push
bytes, aggregation, barrier membership, samples counted - follows the share it
actually runs. Parameter pulls leave the shard before the worker knows which
share it will run; when a share grows and the model has sparse tables, the
missing rows are fetched in a top-up pull before the compute that needs them.
A worker with share 0 idles: under BSP it still receives parameters but sends
no gradient and leaves that iteration's barrier; under ASP/SSP it waits for a
rebalance that gives it work (and does not hold back the SSP bound). The BSP
update cost of a sparse table uses the shares of the latest plan (exact for
dense layers).

Time to target (``job.target_loss``): every applied update adds its samples,
discounted by the convergence model (:mod:`sim.convergence`) for its batch,
staleness (BSP: 0; ASP/SSP: the mean over its chunks of the updates applied
since the worker pulled them) and the job's gradient bits, to a count of
effective samples; the simulated time at which that count reaches the
model's target is ``time_to_target_s``, and the run stops at the end of that
global iteration. ``job.iterations`` (the BSP prediction) times
``TARGET_CAP`` bounds the run; a target not reached by then is noted in
``extra["target_not_reached"]``. Effective samples are counted whenever the
job has a convergence model (a target or adaptive quantization), each update
at the bits it was sent with, and the modelled loss at every global
iteration's end is kept (``RunResult.iter_loss``, the ``loss`` column).

Adaptive quantization (``job.quant_adaptive``): at the end of every
``job.quant_every``-th global iteration the modelled loss is appended to a
history and the policy gives the width; a new width rebuilds every worker's
cost rows (``plan_costs`` at that ``quant_bits``, for the current plan), which
each worker takes from its next iteration like a rebalanced share.
``extra["quant_bits"]`` lists the ``[iteration, bits]`` changes, from ``[0, start]``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import heapq
import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from sim.convergence import model_tensor_elems
from sim.costmodel import PlanCosts, plan_costs
from sim.des.hosts import HostCPU
from sim.des.network import FlowNetwork
from sim.des.shard import ShardServer
from sim.des.timer import Timer, call_later, sleep
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.plan import Plan
from sim.problem import Problem
from sim.result import DeviceUsage, RunResult, Trace
from sim.scheduling import OnlineScheduler

_COMPUTE, _BLOCKED, _DONE = 0, 1, 2
#: Spawn-key namespace of the compute-noise streams under the config's root seed (b"NOI").
NOISE_STREAM = 0x4E4F49


def noise_factors(seed: int, device: int, rel_iqr: float, chunk: int = 256) -> Iterator[float]:
    """Compute-time factors of the worker on device ``device`` (its index in the cluster),
    one per iteration: lognormal with median 1 whose relative IQR (IQR / median) is
    ``rel_iqr`` (``sigma = asinh(rel_iqr / 2) / 0.6745``, 0.6745 the standard normal's
    upper quartile), drawn from ``SeedSequence(seed, spawn_key=(NOISE_STREAM, device))``:
    a worker's draws depend on neither the plan nor the other workers."""
    sigma = math.asinh(rel_iqr / 2.0) / 0.6744897501960817
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(NOISE_STREAM, device)))
    while True:
        yield from np.exp(sigma * rng.standard_normal(chunk)).tolist()
#: with a target loss, run at most this many times the iterations BSP would need
TARGET_CAP = 100
#: allocations between young-generation garbage collections while a run is in progress
GC_GEN0_DURING_RUN = 50_000


@contextlib.contextmanager
def rare_gc() -> Iterator[None]:
    """Collect cyclic garbage rarely while an event loop runs.

    A run allocates millions of short-lived objects (events, heap entries,
    closures) that reference counting frees as soon as they fire; few form
    cycles (an online rebalance's plan objects). At Python's default threshold
    the cyclic collector runs every 700 allocations, and its older generations
    rescan the run's whole state, which grows with workers x chunks: 30-50% of
    a run's time. Every 50,000 allocations still reclaims those cycles. The
    objects that exist when the run starts (the problem, its costs, whatever
    the caller holds) are frozen (``gc.freeze``) for the run, so a full
    collection during it scans only what the run allocated; they are unfrozen
    after it (unless the caller had frozen objects itself: then nothing is
    frozen or unfrozen here). Garbage collection never changes what the
    simulation computes, only when memory is freed. The threshold is
    process-wide, so it is restored however the run ends (and a threshold of 0,
    collection switched off, is left alone).
    """
    old = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    gc.set_threshold(old[0] and max(old[0], GC_GEN0_DURING_RUN), *old[1:])
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*old)


def run_until(env: simpy.Environment, until: simpy.Event) -> None:
    """``env.run(until=until)`` with SimPy's step inlined: the same events processed in
    the same order, and the same stop (right after ``until`` is processed) and errors
    (``RuntimeError`` when the queue runs dry first; a failed, undefused event raises
    its exception), without a method call and a ``try`` per event.

    Per event the loop only pops, runs the callbacks and checks the outcome: an empty
    queue shows as ``heappop``'s ``IndexError``, and a callback list of other than one
    as the ``ValueError`` of unpacking one (a ``try`` costs nothing until it raises),
    and ``until`` is recognised by identity once processed (it is processed only here,
    when popped, so its ``callbacks`` need not be read every event).
    """
    if until.callbacks is None:  # processed already
        return
    queue, pop = env._queue, heapq.heappop
    while True:
        try:
            env._now, _, _, event = pop(queue)
        except IndexError:
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}') from None
        callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
        # nearly every event has one callback: unpacked and called, without len() or a list
        # iterator (~20 ns an event; the try costs nothing unless another count raises).
        # Equivalent: nothing appends to a list taken off its event (see _Process)
        try:
            (callback,) = callbacks
        except ValueError as many:
            try:
                for callback in callbacks:
                    callback(event)
            except BaseException as e:
                if e.__context__ is many:  # the unpacking's error is no part of a callback's
                    e.__context__ = None
                raise
        else:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
        if event is until:
            return


class _Process(simpy.Process):
    """A ``simpy.Process`` whose resume does less per event: the workers run in these
    (a resume per compute step, the run's most frequent event).

    The common case, a succeeded event whose value is sent into the generator and a
    fresh event yielded back, runs here with the generator's ``send`` and the resume
    callback bound once (SimPy binds both anew at every resume); anything else (an
    interrupt or a failed event to throw in, a yielded event that was processed
    already) goes to ``simpy.Process._resume`` at that point, which carries on exactly
    as it would have. Where ``_resume`` resumes it, the generator's end (or an exception
    out of it) is handled as SimPy does: the process is scheduled as an event with its
    value.

    ``armed``: a worker's compute step (see :meth:`DataParallelSim._worker`), which the
    worker yields carrying its resume already: ``_resume`` adds none to it. That resume
    is either ``_resume`` or, where the worker registers its next yield itself, the
    generator's ``send`` alone (no frame of ``_resume`` between: measured ~100 ns of a
    step's ~1.1 us); an interrupt puts ``_resume`` back first, where SimPy's
    ``Interruption`` looks for it. A step resumed by ``send`` alone is not guarded: an
    exception out of the worker there leaves the event loop as it is (the run fails
    either way, with the same error), and the worker guarantees that the generator
    neither ends nor survives an interrupt after such a step (see ``direct`` in
    :meth:`DataParallelSim._worker`).
    """

    def __init__(self, env: simpy.Environment, generator: Any) -> None:
        super().__init__(env, generator)
        self._send = generator.send
        # equal to ``self._resume`` (an interrupt removes that from the target's callbacks)
        self._resume_cb = self._resume
        self.armed: Timer | None = None

    def interrupt(self, cause: Any = None) -> None:
        target = self._target
        if target is not None and target is self.armed and target.callbacks is not None:
            target.callbacks = [self._resume_cb]  # (its send, if it carried that)
        super().interrupt(cause)

    def _resume(self, event: Any) -> None:
        if not event._ok:  # an interrupt or a failed event: thrown in by SimPy
            simpy.Process._resume(self, event)
            return
        env = self.env
        env._active_proc = self
        try:
            event = self._send(event._value)
        except StopIteration as e:  # the process ended
            self._ok = True
            self._value = e.args[0] if e.args else None
            env.schedule(self)
            event = None
        except BaseException as e:  # the process failed
            self._ok = False
            e.__traceback__ = e.__traceback__.tb_next  # type: ignore[union-attr]
            self._value = e
            env.schedule(self)
            event = None
        else:
            callbacks = event.callbacks
            if callbacks is None:  # processed already: SimPy sends its value on
                simpy.Process._resume(self, event)
                return
            if event is not self.armed:  # (that carries its resume already)
                callbacks.append(self._resume_cb)
        self._target = event
        env._active_proc = None


class _Acct:
    """Per-worker time split: compute, blocked on own transfers (comm), blocked otherwise (wait)."""

    __slots__ = ("state", "t", "inflight", "compute", "comm", "wait")

    def __init__(self) -> None:
        self.state = _BLOCKED
        self.t = 0.0
        self.inflight = 0
        self.compute = 0.0
        self.comm = 0.0
        self.wait = 0.0

    def advance(self, now: float) -> None:
        dt = now - self.t
        self.t = now
        if self.state == _COMPUTE:
            self.compute += dt
        elif self.state == _BLOCKED:
            if self.inflight > 0:
                self.comm += dt
            else:
                self.wait += dt


class _Queued:
    """A message waiting for its serial links (``Host.serial_messages``): it starts once it
    heads the queue of each of them."""

    __slots__ = ("start", "queues", "started")

    def __init__(self, start: Callable[[], None], queues: tuple[collections.deque[_Queued], ...]) -> None:
        self.start, self.queues, self.started = start, queues, False

    def try_start(self) -> None:
        if self.started or any(q[0] is not self for q in self.queues):
            return
        self.started = True
        self.start()


class DataParallelSim:
    """One DES run of a single-stage plan. Use :func:`sim.des.simulate`."""

    def __init__(self, problem: Problem, plan: Plan, costs: PlanCosts, trace: bool = True,
                 on_iteration: Callable[[int], None] | None = None, scheduler: Any = None) -> None:
        self.problem, self.plan, self.c = problem, plan, costs
        self.env = env = simpy.Environment()
        job = problem.job
        N, S, C = len(costs.workers), len(costs.shards), costs.n_chunks
        self.N, self.S, self.C, self.G = N, S, C, costs.n_groups
        self.n_iter = job.iterations
        self.sync = job.sync
        # link ids: worker up w, worker down N+w, shard up 2N+s, shard down 2N+S+s
        bw = list(costs.worker_bw) * 2 + list(costs.shard_bw) * 2
        self.net = FlowNetwork(env, bw, costs.latency_s, fair=problem.cluster.network.sharing == "fair")
        self.trace = Trace() if trace else None
        # Hosts (cluster.hosts): process ids are workers 0..N-1 then shards N..N+S-1; a
        # device without a placement keeps its compute to itself (plain timeouts).
        cl = problem.cluster
        placed = [cl.placed(d) for d in (*costs.workers, *costs.shards)]
        self.cpu: HostCPU | None = None
        self.proc: list[int | None] = [None] * (N + S)  # process id on self.cpu
        # Message copies (a host with copy_Bps): each process moving bytes in or out runs
        # one more thread, a process of its own on self.cpu (one thread, the same cores),
        # for nbytes / copy_Bps seconds of CPU per message end (see _transfer).
        self.copier: list[int | None] = [None] * (N + S)
        self.wake_at: list[tuple[int, float] | None] = [None] * (N + S)
        self.copy_s_per_B: list[float] = [0.0] * (N + S)
        # messages with bytes each process sent or received (its ends), counted where messages
        # go through the host (host_messages below)
        self.msg_ends: list[int] = [0] * (N + S)
        if any(pl is not None for pl in placed):
            ids = [i for i, pl in enumerate(placed) if pl is not None]
            procs = [pl for pl in placed if pl is not None]
            for k, i in enumerate(ids):
                self.proc[i] = k
            for i in ids:
                pl = placed[i]
                assert pl is not None
                rate = cl.hosts[pl.host].copy_Bps
                if not pl.copy_scale > 0:  # NaN too
                    raise ValueError("a placement's copy_scale must be > 0")
                if rate > 0:
                    self.copier[i] = len(procs)
                    self.copy_s_per_B[i] = 1.0 / rate
                    procs.append(dataclasses.replace(pl, threads=1, cpu_scale=pl.cpu_scale * pl.copy_scale,
                                                     copy_scale=1.0))
            self.cpu = HostCPU(env, cl.hosts, procs)
            # a message's receiver on a host with wake_s: that host and its wake-up latency
            for i in ids:
                pl = placed[i]
                assert pl is not None
                if cl.hosts[pl.host].wake_s > 0:
                    self.wake_at[i] = (pl.host, cl.hosts[pl.host].wake_s)
        # Serial messages (a host with serial_messages): each of its processes' links carries
        # one message at a time, first issued first served; a message starts once it heads
        # the queue of both its links (see _transfer). Link ids as for ``bw`` above.
        self.link_queue: list[collections.deque[_Queued] | None] = [None] * (2 * N + 2 * S)
        for i, pl in enumerate(placed):
            if pl is not None and cl.hosts[pl.host].serial_messages:
                ups = (i, N + i) if i < N else (2 * N + (i - N), 2 * N + S + (i - N))
                for link in ups:
                    self.link_queue[link] = collections.deque()
        # messages that cost host CPU or wake-up time or wait their turn (else the network
        # alone carries them)
        self.host_messages = any(x is not None for x in (*self.copier, *self.wake_at, *self.link_queue))
        self.servers = [ShardServer(env, self._span_cb(s) if trace else None, self._shard_run(s)) for s in range(S)]
        # the host flow of each worker's compute in progress (cancelled if the worker fails)
        self.flow: list[Any] = [None] * N
        # job.compute_noise: per worker, its compute factors (None: no noise)
        index = {d.id: i for i, d in enumerate(problem.cluster.devices)}
        rel = dict(zip((d.id for d in problem.cluster.devices), problem.job.compute_noise))
        self.noise: list[Iterator[float] | None] = [
            noise_factors(problem.seed, index[dev], rel[dev]) if rel.get(dev, 0.0) > 0 else None
            for dev in costs.workers]
        self.groups: list[list[int]] = [[] for _ in range(self.G)]
        for c_, g in enumerate(costs.chunk_group):
            self.groups[int(g)].append(c_)
        # Plain Python lists: indexing numpy scalars in the hot path is slow.
        self.fwd = costs.fwd_s.tolist()
        self.bwd = costs.bwd_s.tolist()
        self.pull_b = costs.pull_bytes.tolist()
        self.push_b = costs.push_bytes.tolist()
        self.agg = costs.agg_s.tolist()
        self.apply_all = costs.apply_s.tolist()
        self.apply_one = costs.apply_one_s.tolist()
        self.chunk_shard = [int(s) for s in costs.chunk_shard]
        # pushes layer-wise but pulls whole (job.pipeline_pulls false, the runtime's way): a
        # worker's chunks leave the shards together once all are applied, and its forward
        # waits for all of them
        self.pull_whole = job.pipeline and not job.pipeline_pulls and C > 1
        self.batch = [int(b) for b in costs.batch]
        self.wbits = [job.quant_bits] * N  # gradient bits of the iteration each worker runs
        self.slow = [1.0] * N
        self.alive = [True] * N
        # the BSP barrier group (a worker leaves once its failure is detected): a set, which each
        # applied chunk's barrier (missing, below) copies
        self.members = set(range(N))
        self.computing = [False] * N
        self.acct = [_Acct() for _ in range(N)]
        # ready[w][c]: chunk c's parameters for the next iteration w runs: True when they
        # arrived before w asked (no event needed), the event w waits on when it asked
        # first, None when neither happened yet; cleared when the worker takes it. One
        # slot per (w, c) is enough: a chunk's next pull to w is issued only after w's
        # gradient of that chunk (or its abstention) reached the shard, i.e. after w
        # took the slot.
        self.ready: list[list[simpy.Event | bool | None]] = [[None] * C for _ in range(N)]
        # trace labels, built once
        self.pull_label = [f"pull c{c}" for c in range(C)]
        self.push_label = [f"push c{c}" for c in range(C)]
        self.agg_label = [f"agg c{c}" for c in range(C)]
        self.apply_label = [f"apply c{c}" for c in range(C)]
        # link ids of each worker's and each chunk's ends (see ``bw`` above)
        self.chunk_up = [2 * N + int(s) for s in costs.chunk_shard]
        self.chunk_down = [2 * N + S + int(s) for s in costs.chunk_shard]
        self.iter_end: list[float] = []
        self.iter_samples: list[int] = []
        self.failures: list[dict[str, Any]] = []
        self.finished = env.event()
        self.procs: list[simpy.Process] = []
        self.incomplete = ""
        self.on_iteration = on_iteration
        # BSP state
        self.chunk_iter = [0] * C
        self.missing = [set(range(N)) for _ in range(C)]
        self.applied_in_iter: dict[int, int] = {}
        self.samples_in_iter: dict[int, int] = {}
        # ASP/SSP state
        self.version = [0] * C
        self.pulled_version = [[0] * C for _ in range(N)]
        self.staleness: list[int] = []
        self.worker_chunks_applied: dict[tuple[int, int], int] = {}
        self.samples_applied = 0
        self.completed = [0] * N
        self.ssp_waiters: list[tuple[int, simpy.Event]] = []
        # Online scheduling. ``next_*`` is the share (and its cost rows) a worker takes
        # at the next iteration it starts; ``batch`` and the rows above are the ones it runs.
        self.rebalance_fn: Callable[[Plan, Observation], Plan | None] | None = (
            scheduler.rebalance if isinstance(scheduler, OnlineScheduler) else None)
        self.online = self.rebalance_fn is not None
        self.plan_now = plan
        # (batch, fwd, bwd, pull, push, agg, apply_one, bits) rows of the pending share
        self.next_rows: list[tuple[Any, ...] | None] = [None] * N
        self.next_pull = list(self.pull_b)
        self.issued: dict[tuple[int, int, int], float] = {}
        self.win_compute = [0.0] * N
        self.win_samples = [0] * N
        self.free_frac = [1.0] * N
        self.detected = [False] * N
        self.idle = [False] * N
        self.wake: list[simpy.Event | None] = [None] * N
        self.rebalances = 0
        # Effective samples and the modelled loss (whenever a convergence model is present)
        target = job.target_loss
        self.conv = job.convergence
        self.has_target = target is not None and self.conv is not None
        self.eff_samples = 0.0
        self.time_to_target: float | None = None
        self.stale_sum: dict[tuple[int, int], int] = {}
        self.iter_loss: list[float] = []
        self.bits_in_iter: dict[int, dict[int, int]] = {}  # BSP: iteration -> bits -> samples
        if self.conv is not None:
            self.tensor_elems = model_tensor_elems(job.model)
        if self.has_target:
            assert self.conv is not None and target is not None
            self.n_iter = job.iterations * TARGET_CAP
            self.eff_target = self.conv.effective_to_target(target)
        # Adaptive quantization: the width follows the modelled loss
        self.qpolicy = job.quant_adaptive
        self.adopting = self.online or self.qpolicy is not None
        self.qproblem = problem  # the problem at the current width (plan_costs input)
        self.loss_history: list[float] = []
        self.quant_changes: list[tuple[int, int]] = [(0, job.quant_bits)]
        # A shard task's key (its order among tasks ready at one instant) is (chunk, worker),
        # the update after every worker (N) of its chunk: as one int, c * (N + 1) + w.
        self.key_base = N + 1
        self.chunk_server = [self.servers[s] for s in self.chunk_shard]
        # Delivery callbacks made once per (worker, chunk) rather than per message, where
        # a delivery needs nothing else: no trace (the send time), and for pushes BSP (no
        # iteration) with fixed shares and widths (the aggregation cost of the share).
        self.pulled_cb: list[list[Callable[[], None]]] | None = None
        self.pushed_cb: list[list[Callable[[], None]]] | None = None
        # Where the network alone carries them and the pulls' sizes are fixed (no online
        # shares), each chunk's pull to every worker as (dst link, bytes, delivery) rows, made
        # once and started in one FlowNetwork.transfer_many call (see _pull_all).
        self.pull_rows: list[list[tuple[int, float, Callable[[], None]]]] | None = None
        # N x C objects of each kind, made with the collector held off as in a run (at the
        # default threshold it would rescan everything alive ~every 700 of them: measured,
        # 64 x 114: 5-6.6 ms -> 2.3 ms of the construction)
        with rare_gc():
            if self.trace is None:
                # partials of the plain functions with self first: no bound method in between
                pulled, pushed = DataParallelSim._pulled, DataParallelSim._pushed_bsp
                self.pulled_cb = [[partial(pulled, self, w, c) for c in range(C)] for w in range(N)]
                if self.sync == "bsp" and not self.adopting:
                    self.pushed_cb = [[partial(pushed, self, w, c, agg) for c, agg in enumerate(self.agg[w])]
                                      for w in range(N)]
            if (self.pulled_cb is not None and not self.online and not self.host_messages
                    and self.sync == "bsp" and not self.pull_whole):  # where _pull_all is called
                cbs = self.pulled_cb
                self.pull_rows = [[(N + w, self.next_pull[w][c], cbs[w][c]) for w in range(N)] for c in range(C)]

    # ------------------------------------------------------------------ helpers
    def _shard_run(self, s: int) -> Callable[[float, Callable[[], None]], object] | None:
        """How shard s executes its work: on its host's cores, or None (a plain timeout)."""
        cpu, k = self.cpu, self.proc[self.N + s]
        if cpu is None or k is None:
            return None
        return lambda cost, done: cpu.compute(k, cost, done)

    def _span_cb(self, s: int) -> Any:
        def cb(label: str, t0: float, t1: float) -> None:
            assert self.trace is not None
            self.trace.span("ps", s, self.c.shards[s], label, t0, t1)
        return cb

    # The hot paths below (a transfer and its delivery, the worker loop) read the
    # clock as ``env._now``: the value of SimPy's ``now`` property without the call.
    # Some inline ``_Acct.advance`` (marked where they do): a method call is a good part
    # of the cost of a message end or a compute step, the run's most frequent work.
    def _pull(self, w: int, it: int, c: int, nbytes: float | None = None,
              ev: simpy.Event | None = None) -> None:
        """Send chunk c's parameters for iteration ``it`` from its shard to worker w
        (``nbytes`` and ``ev``: a top-up of missing sparse rows)."""
        t0 = self.env._now
        a = self.acct[w]
        a.advance(t0)
        a.inflight += 1
        if ev is None:
            nbytes = self.next_pull[w][c]
            if self.online:
                self.issued[(w, it, c)] = nbytes
        assert nbytes is not None
        # A partial of a method, not a closure: one object made per message instead of a
        # function and a cell per captured variable; made once per (worker, chunk) where
        # the delivery needs nothing else (``pulled_cb``).
        if ev is None and self.pulled_cb is not None:
            delivered = self.pulled_cb[w][c]
        else:
            delivered = partial(self._pulled, w, c, t0, ev)
        if self.host_messages:
            self._transfer(self.N + self.chunk_shard[c], w, self.chunk_up[c], self.N + w, nbytes, delivered)
        else:
            self.net.transfer(self.chunk_up[c], self.N + w, nbytes, delivered)

    def _pull_all(self, it: int, c: int) -> None:
        """``_pull(w, it, c)`` to every live worker w in turn (BSP: chunk c was applied).

        Where the network alone carries the messages and the deliveries need only their
        worker and chunk (``pull_rows``: no trace, no online shares), the loop is
        ``_pull``'s with ``_Acct.advance`` inlined, and the messages start in one call (the
        workers' times and the network's state are apart: the order between them is free)."""
        rows, alive = self.pull_rows, self.alive
        if rows is None:
            for w in range(self.N):
                if alive[w]:
                    self._pull(w, it, c)
            return
        now = self.env._now
        for w, a in enumerate(self.acct):
            if alive[w]:
                # a.advance(now), inlined (see _Acct.advance)
                dt = now - a.t
                a.t = now
                if a.state == _COMPUTE:
                    a.compute += dt
                elif a.state == _BLOCKED:
                    if a.inflight > 0:
                        a.comm += dt
                    else:
                        a.wait += dt
                a.inflight += 1
        mine = rows[c] if all(alive) else [r for r, up in zip(rows[c], alive) if up]
        self.net.transfer_many(self.chunk_up[c], mine)

    def _landed(self, w: int, label: str, t0: float) -> None:
        """A message of worker w's, sent at ``t0``, arrived: one transfer fewer in flight."""
        now = self.env._now
        a = self.acct[w]
        a.advance(now)
        a.inflight -= 1
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], label, t0, now)

    def _pulled(self, w: int, c: int, t0: float = 0.0, done: simpy.Event | None = None) -> None:
        """Chunk c's parameters, sent at ``t0`` (read only by a trace), reached worker w
        (``done``: a top-up's event). ``_landed`` inlined."""
        now = self.env._now
        a = self.acct[w]
        # a.advance(now), inlined (see _Acct.advance)
        dt = now - a.t
        a.t = now
        if a.state == _COMPUTE:
            a.compute += dt
        elif a.state == _BLOCKED:
            if a.inflight > 0:
                a.comm += dt
            else:
                a.wait += dt
        a.inflight -= 1
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], self.pull_label[c], t0, now)
        if done is not None:  # a top-up
            done.succeed()
            return
        slot = self.ready[w]
        waiting = slot[c]
        if waiting is None:  # no one waits yet: no event needed
            slot[c] = True
        else:  # the worker asked first and waits on this event (never True: one pull per slot)
            waiting.succeed()  # type: ignore[union-attr]

    def _push(self, w: int, it: int, c: int) -> None:
        t0 = self.env._now
        a = self.acct[w]
        a.advance(t0)
        a.inflight += 1
        # the shard's work follows the share of the iteration that produced the gradient
        delivered: Callable[[], None]
        if self.sync == "bsp":  # the aggregation alone
            delivered = partial(self._pushed_bsp, w, c, self.agg[w][c], t0)
        else:  # aggregated and applied at once
            delivered = partial(self._pushed, w, it, c, t0, self.agg[w][c] + self.apply_one[w][c], self.batch[w],
                                self.wbits[w])
        if self.host_messages:
            self._transfer(w, self.N + self.chunk_shard[c], w, self.chunk_down[c], self.push_b[w][c], delivered)
        else:
            self.net.transfer(w, self.chunk_down[c], self.push_b[w][c], delivered)

    def _push_group(self, w: int, it: int, chunks: list[int]) -> None:
        """``_push(w, it, c)`` for each chunk c of a layer group whose backward just ended,
        in order. The pushes leave at one instant, so the worker's time is advanced once
        (another advance would add 0); where the network alone carries them and their
        deliveries are made once (``pushed_cb``: BSP, no trace, no share or width changes)
        the loop is ``_push``'s without the calls."""
        a = self.acct[w]
        a.advance(self.env._now)
        cbs = self.pushed_cb
        if cbs is None or self.host_messages:
            for c in chunks:
                self._push(w, it, c)
            return
        transfer, down, nbytes, mine = self.net.transfer, self.chunk_down, self.push_b[w], cbs[w]
        for c in chunks:
            a.inflight += 1
            transfer(w, down[c], nbytes[c], mine[c])

    def _pushed(self, w: int, it: int, c: int, t0: float, cost: float, batch: int, bits: int) -> None:
        """ASP/SSP: worker w's gradient of chunk c (iteration ``it``), sent at ``t0``, reached
        its shard, which aggregates and applies it in one task of ``cost`` seconds."""
        self._landed(w, self.push_label[c], t0)
        self.chunk_server[c].submit(c * self.key_base + w, cost, self.apply_label[c],
                                    lambda: self._async_applied(w, it, c, batch, bits))

    def _pushed_bsp(self, w: int, c: int, agg: float, t0: float = 0.0) -> None:
        """``_pushed`` under BSP, where the shard's work is the aggregation (``agg``) alone:
        ``_landed`` inlined (a push is a third of a run's message ends); its aggregation
        joins the chunk's barrier, whose last arrival submits the update."""
        now = self.env._now
        a = self.acct[w]
        # a.advance(now), inlined (see _Acct.advance)
        dt = now - a.t
        a.t = now
        if a.state == _COMPUTE:
            a.compute += dt
        elif a.state == _BLOCKED:
            if a.inflight > 0:
                a.comm += dt
            else:
                a.wait += dt
        a.inflight -= 1
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], self.push_label[c], t0, now)
        miss = self.missing[c]
        miss.discard(w)
        self.chunk_server[c].submit(c * self.key_base + w, agg, self.agg_label[c], None)
        if not miss:
            self._submit_apply(c)

    def _transfer(self, src: int, dst: int, src_link: int, dst_link: int, nbytes: float,
                  delivered: Callable[[], None]) -> None:
        """A message from process ``src`` to ``dst`` (workers 0..N-1, shards N..):
        over the network, and where an end sits on a host with ``copy_Bps``, also
        ``nbytes / copy_Bps`` seconds of CPU on that host for the end's copy (the
        sender's into the transport, the receiver's out of it), competing for its
        cores like any compute. The three run side by side (as a message holds both
        its links at once); ``delivered`` when all are done. Where the receiver sits on a
        host with ``wake_s`` whose cores are all busy at that moment, it gets the message
        ``wake_s`` later (it waits for a core to be woken on).

        Where a link is serial (its process's host has ``serial_messages``), the message
        first waits until every earlier message on that link is delivered: it joins the
        queues of both its links at once and starts when it heads both, so messages start
        in the order they were issued and two never wait for each other."""
        qa, qb = self.link_queue[src_link], self.link_queue[dst_link]
        if qa is not None or qb is not None:
            first = delivered

            def done() -> None:
                for q in (qa, qb):
                    if q is not None:
                        q.popleft()  # a running message heads its queues
                first()
                for q in (qa, qb):
                    if q:
                        q[0].try_start()

            msg = _Queued(lambda: self._transfer_now(src, dst, src_link, dst_link, nbytes, done),
                          tuple(q for q in (qa, qb) if q is not None))
            for q in msg.queues:
                q.append(msg)
            msg.try_start()
            return
        self._transfer_now(src, dst, src_link, dst_link, nbytes, delivered)

    def _transfer_now(self, src: int, dst: int, src_link: int, dst_link: int, nbytes: float,
                      delivered: Callable[[], None]) -> None:
        """:meth:`_transfer` once the message may go: the network, the copies and the wake-up."""
        if nbytes > 0:
            ends = self.msg_ends
            ends[src] += 1
            ends[dst] += 1
        if self.wake_at[dst] is not None:
            host, wake_s = self.wake_at[dst]  # type: ignore[misc]
            assert self.cpu is not None
            busy, env, arrived = self.cpu.busy, self.env, delivered

            def delivered() -> None:
                if busy(host):
                    call_later(env, wake_s, lambda _ev: arrived())
                else:
                    arrived()
        copier = self.copier
        a, b = copier[src], copier[dst]
        if (a is None and b is None) or nbytes <= 0:
            self.net.transfer(src_link, dst_link, nbytes, delivered)
            return
        cpu = self.cpu
        assert cpu is not None
        left = 1 + (a is not None) + (b is not None)

        def one() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                delivered()

        self.net.transfer(src_link, dst_link, nbytes, one)
        if a is not None:
            cpu.compute(a, nbytes * self.copy_s_per_B[src], one)
        if b is not None:
            cpu.compute(b, nbytes * self.copy_s_per_B[dst], one)

    # --------------------------------------------------------------- shard side
    def _abstain(self, w: int, c: int) -> None:
        """An idle worker (share 0) leaves the current BSP iteration's barrier of chunk c."""
        miss = self.missing[c]
        miss.discard(w)
        if not miss:
            self._submit_apply(c)

    def _submit_apply(self, c: int) -> None:
        # The update is its own task, keyed after every worker's aggregation of this
        # chunk, so it never runs before one that arrived at the same instant.
        self.chunk_server[c].submit(c * self.key_base + self.N, self.apply_all[c], self.apply_label[c],
                                    lambda: self._bsp_applied(c))

    def _bsp_applied(self, c: int) -> None:
        it = self.chunk_iter[c]
        self.chunk_iter[c] = it + 1
        # Until its failure is detected, a dead worker is still waited for.
        self.missing[c] = self.members.copy()
        n = self.applied_in_iter.get(it, 0) + 1
        self.applied_in_iter[it] = n
        if n == self.C:
            samples = self.samples_in_iter.pop(it, 0)
            by_bits = self.bits_in_iter.pop(it, {})
            for bits in sorted(by_bits):
                self._credit(by_bits[bits], samples, 0.0, bits)
            self._end_iteration(samples)
        if it + 1 < self.n_iter:
            if self.pull_whole:  # every chunk once the iteration's last one is applied
                if n == self.C:
                    for w in range(self.N):
                        if self.alive[w]:
                            for c_ in range(self.C):
                                self._pull(w, it + 1, c_)
                return
            self._pull_all(it + 1, c)

    def _async_applied(self, w: int, it: int, c: int, batch: int, bits: int) -> None:
        st = self.version[c] - self.pulled_version[w][c]
        self.staleness.append(st)
        self.version[c] += 1
        key = (w, it)
        n = self.worker_chunks_applied.get(key, 0) + 1
        if self.conv is not None:
            self.stale_sum[key] = self.stale_sum.get(key, 0) + st
        if n == self.C:
            self.worker_chunks_applied.pop(key, None)
            if self.conv is not None:
                self._credit(batch, batch, self.stale_sum.pop(key) / self.C, bits)
            self.samples_applied += batch
            B = self.problem.job.global_batch
            while self.samples_applied >= (len(self.iter_end) + 1) * B and not self.finished.triggered:
                self._end_iteration(B)
        else:
            self.worker_chunks_applied[key] = n
        if not self.finished.triggered and self.alive[w]:
            if not self.pull_whole:
                self.pulled_version[w][c] = self.version[c]
                self._pull(w, it + 1, c)
            elif n == self.C:  # all of w's chunks applied: it pulls them all
                for c_ in range(self.C):
                    self.pulled_version[w][c_] = self.version[c_]
                    self._pull(w, it + 1, c_)

    def _credit(self, samples: int, batch: int, staleness: float, bits: int) -> None:
        """``samples`` samples of an update of ``batch``, sent with ``bits``, were applied:
        count them as effective samples (loss, target)."""
        if self.conv is None:
            return
        self.eff_samples += self.conv.effective_samples(samples, batch, staleness, bits, self.tensor_elems)
        if (self.has_target and self.time_to_target is None
                and self.eff_samples >= self.eff_target * (1 - 1e-9)):
            self.time_to_target = self.env.now

    def _end_iteration(self, samples: int) -> None:
        self.iter_end.append(self.env.now)
        self.iter_samples.append(samples)
        if self.conv is not None:
            self.iter_loss.append(float(self.conv.loss(self.eff_samples)))
        if self.on_iteration is not None:
            self.on_iteration(len(self.iter_end))
        done = len(self.iter_end) >= self.n_iter or self.time_to_target is not None
        if done and not self.finished.triggered:
            self.finished.succeed()
        if self.qpolicy is not None and not self.finished.triggered:
            self._requantize()
        if self.online and not self.finished.triggered:
            self._rebalance()

    def _requantize(self) -> None:
        """Adaptive quantization: observe the loss (every ``quant_every`` iterations) and,
        when the policy's width changes, rebuild every worker's cost rows at the new width
        (taken from each worker's next iteration, like a rebalanced share)."""
        assert self.qpolicy is not None
        k = len(self.iter_end)
        if k % self.problem.job.quant_every:
            return
        self.loss_history.append(self.iter_loss[-1])
        cur = self.qproblem.job.quant_bits
        if self.qpolicy.monotone and cur == self.qpolicy.levels[-1]:
            return  # already the finest: a monotone policy never goes coarser
        q = self.qpolicy.bits(k, self.loss_history)
        if q == cur:
            return
        self.qproblem = dataclasses.replace(self.problem, job=dataclasses.replace(self.problem.job, quant_bits=q))
        self.quant_changes.append((k, q))
        # plan_now holds every pending share (a rebalance updates it), so its costs
        # at the new width are the rows each worker takes next.
        self._stage(self.plan_now)

    # -------------------------------------------------------------- worker side
    def _worker(self, w: int) -> Any:
        env, acct = self.env, self.acct[w]
        fwd, bwd, groups = self.fwd[w], self.bwd[w], self.groups
        tr = self.trace
        name = self.c.workers[w]
        ready = self.ready[w]
        slowed = w in self.slowed  # only these can have a compute interrupted by a slowdown
        hosted = self.proc[w] is not None
        plain = not hosted and not slowed  # nothing can interrupt its compute: a plain timeout
        # a plain compute step is a Timer pushed here, as sim.des.timer.sleep would (the
        # step is the run's most frequent event: the call is worth saving). It is one Timer,
        # re-armed for each step: a step is pushed only once the worker has resumed, i.e.
        # after the previous one was popped and its callbacks taken, and a failure leaves the
        # worker (and its pending step) for good. Making and freeing one costs ~50 ns of a
        # bare step's ~300 (a loop of timeouts alone).
        step = Timer()
        # The step carries its resume (_Process.armed). Where every other yield of the loop
        # is a chunk's wait (BSP, no online shares: no sub-generator), that is the generator's
        # send alone, and the worker registers a wait itself when no _resume did ("direct":
        # it was resumed by send, running with no active process set, which nothing here
        # reads); not for the last backward step of an iteration, after which it may end
        # (its end is _resume's to handle).
        proc = self.procs[w]
        gsend, resume_cb = proc._send, proc._resume_cb  # type: ignore[attr-defined]
        # A step's callbacks: one of two lists made once, not a fresh one per step. Nothing
        # mutates them: the event loop only iterates them (it may still be iterating the one
        # the step is re-armed with: unchanged, that is harmless), _Process._resume appends
        # nothing to an armed step, and _Process.interrupt replaces them with a fresh list
        # before SimPy removes _resume from it (measured: ~35 ns of a step).
        on_send, on_resume = [gsend], [resume_cb]
        if plain:
            proc.armed = step  # type: ignore[attr-defined]
        queue: list[Any] = env._queue
        eid, push = env._eid, heapq.heappush
        G, bsp, online, batch = self.G, self.sync == "bsp", self.online, self.batch
        direct_ok = plain and bsp and not online  # (see step above)
        direct = False
        adopt_at_pull = self.adopting and bsp  # BSP takes a new share with its first parameters
        # the chunks each forward group waits for: pulled whole, the first group every chunk and
        # the others none
        all_chunks = list(range(self.C))
        fchunks = groups if not self.pull_whole else [all_chunks] + [[] for _ in range(G - 1)]
        fwd_cbs = on_send if direct_ok else on_resume  # a forward step's (see step above)
        noise = self.noise[w]  # job.compute_noise: a factor per iteration, else None
        push_group = self._push_group
        # the plain path of _push_group, inlined below: None where it is not taken
        pushed = None if self.pushed_cb is None or self.host_messages else self.pushed_cb[w]
        transfer, down, push_b = self.net.transfer, self.chunk_down, self.push_b[w]  # fixed rows where taken
        k = 1.0
        it = 0
        try:
            while it < self.n_iter or not bsp:
                # an iteration ends with a step resumed through _resume (the generator may end)
                assert not direct
                if self.finished.triggered:
                    break
                if noise is not None:
                    k = next(noise)
                if self.adopting and not bsp:
                    self._adopt(w)
                    while self.batch[w] == 0:  # idle until a rebalance gives it work
                        self.idle[w] = True
                        self._ssp_release()
                        acct.advance(env._now)
                        acct.state = _BLOCKED
                        wake = self.wake[w] = env.event()
                        yield wake
                        self.idle[w] = False
                        self._adopt(w)
                    fwd, bwd = self.fwd[w], self.bwd[w]
                if self.sync == "ssp":
                    yield from self._ssp_gate(w, it)
                spent = 0.0
                idle = batch[w] == 0  # the share it runs (set again where it takes a new one)
                for g in range(G):
                    chunks = fchunks[g]
                    for c in chunks:
                        if ready[c] is None:  # not arrived: wait for it
                            ev = ready[c] = env.event()
                            acct.advance(env._now)
                            acct.state = _BLOCKED
                            if direct:  # registered as _resume would (its target was the step)
                                ev.callbacks.append(resume_cb)
                                proc._target = ev
                                direct = False
                            yield ev
                        ready[c] = None
                    if adopt_at_pull and g == 0:
                        self._adopt(w)
                        fwd, bwd = self.fwd[w], self.bwd[w]
                        idle = batch[w] == 0
                    if online:
                        yield from self._top_up(w, it, chunks)
                    if idle:
                        continue
                    t0 = env._now
                    # acct.advance(t0), inlined (see _Acct.advance), then state = _COMPUTE;
                    # while the loop runs the state is _COMPUTE or _BLOCKED
                    dt = t0 - acct.t
                    acct.t = t0
                    if acct.state == _COMPUTE:
                        acct.compute += dt
                    else:
                        if acct.inflight > 0:
                            acct.comm += dt
                        else:
                            acct.wait += dt
                        acct.state = _COMPUTE
                    if plain:
                        direct = direct_ok
                        step.callbacks = fwd_cbs
                        push(queue, (t0 + fwd[g] * k, NORMAL, next(eid), step))
                        yield step
                    elif hosted:
                        yield from self._host_compute(w, fwd[g] * k)
                    else:
                        yield from self._compute(w, fwd[g] * k)
                    spent += env._now - t0
                    if tr is not None:
                        tr.span("workers", w, name, "fwd" if G == 1 else f"fwd g{g}", t0, env._now)
                for g in range(G - 1, -1, -1):
                    if idle:
                        for c in groups[g]:
                            self._abstain(w, c)
                        continue
                    t0 = env._now
                    if plain:
                        # direct, but not the last backward step (g = 0); tested as a branch: a
                        # comparison whose value is stored is never specialised (CPython 3.11)
                        if g and direct_ok:
                            direct = True
                            step.callbacks = on_send
                        else:
                            direct = False
                            step.callbacks = on_resume
                        push(queue, (t0 + bwd[g] * k, NORMAL, next(eid), step))
                        yield step
                    elif hosted:
                        yield from self._host_compute(w, bwd[g] * k)
                    else:
                        yield from self._compute(w, bwd[g] * k)
                    spent += env._now - t0
                    if tr is not None:
                        tr.span("workers", w, name, "bwd" if self.G == 1 else f"bwd g{g}", t0, env._now)
                    chunks = groups[g]
                    if not chunks:
                        continue
                    if pushed is None:
                        push_group(w, it, chunks)
                        continue
                    # push_group(w, it, chunks) inlined where it would take its plain path
                    # (see _push_group): advance once, then a message per chunk
                    now = env._now
                    dt = now - acct.t
                    acct.t = now
                    if acct.state == _COMPUTE:  # always, while it pushes (see _Acct.advance)
                        acct.compute += dt
                    elif acct.inflight > 0:
                        acct.comm += dt
                    else:
                        acct.wait += dt
                    for c in chunks:
                        acct.inflight += 1
                        transfer(w, down[c], push_b[c], pushed[c])
                acct.advance(env._now)
                acct.state = _BLOCKED
                if not idle:
                    self.win_compute[w] += spent
                    self.win_samples[w] += self.batch[w]
                if self.sync == "bsp":
                    self.samples_in_iter[it] = self.samples_in_iter.get(it, 0) + self.batch[w]
                    if self.conv is not None:
                        by_bits = self.bits_in_iter.setdefault(it, {})
                        by_bits[self.wbits[w]] = by_bits.get(self.wbits[w], 0) + self.batch[w]
                else:
                    self.completed[w] = it + 1
                    self._ssp_release()
                it += 1
        except simpy.Interrupt:  # the worker failed (and ends here: nothing resumes it directly again)
            acct.advance(env._now)
            acct.state = _DONE
            return
        # Done computing; its last pushes and the others still run: blocked until the end.
        acct.advance(env._now)
        acct.state = _BLOCKED

    def _compute(self, w: int, work_s: float) -> Any:
        """``work_s`` seconds of nominal compute at the worker's current slowdown; a
        slowdown that changes midway (an interrupt) stretches only what is left."""
        self.computing[w] = True
        try:
            while True:
                t0, slow = self.env.now, self.slow[w]
                try:
                    yield sleep(self.env, work_s * slow)
                    return
                except simpy.Interrupt as e:
                    if e.cause != "slowdown":
                        raise
                    work_s -= (self.env.now - t0) / slow
        finally:
            self.computing[w] = False

    def _host_compute(self, w: int, work_s: float) -> Any:
        """``work_s`` seconds of nominal compute on worker w's host, at its fair share of
        the cores (stretched by the processes and background load it shares them with).

        A slowdown f > 1 (emulated like the runtime does it) then sleeps (f - 1) x the
        elapsed compute, not runnable, so the others get the cores meanwhile; f < 1 (a
        faster device) scales the work. The factor in force when the compute starts
        applies to all of it (a host compute is never interrupted by a slowdown).
        """
        env, cpu, slow = self.env, self.cpu, self.slow[w]
        assert cpu is not None
        t0 = env.now
        done = env.event()
        self.flow[w] = cpu.compute(self.proc[w], work_s * min(slow, 1.0), done.succeed)  # type: ignore[arg-type]
        try:
            yield done
        except simpy.Interrupt:  # failed: its work stops competing for the cores
            if self.flow[w] is not None:
                cpu.cancel(self.flow[w])
            raise
        finally:
            self.flow[w] = None
        if slow > 1.0:
            yield sleep(env, (slow - 1.0) * (env.now - t0))

    def _ssp_gate(self, w: int, it: int) -> Any:
        bound = self.problem.job.staleness
        while it - self._slowest() > bound:
            ev = self.env.event()
            self.ssp_waiters.append((it - bound, ev))
            self.acct[w].advance(self.env.now)
            self.acct[w].state = _BLOCKED
            yield ev

    def _slowest(self) -> int:
        live = [self.completed[v] for v in range(self.N) if self.alive[v] and not self.idle[v]]
        return min(live) if live else 0

    def _ssp_release(self) -> None:
        if not self.ssp_waiters:
            return
        slowest = self._slowest()
        keep = []
        for need, ev in self.ssp_waiters:
            if slowest >= need:
                ev.succeed()
            else:
                keep.append((need, ev))
        self.ssp_waiters = keep

    # ----------------------------------------------------------------- dynamics
    def _slowdown(self, w: int, at_s: float, factor: float) -> Any:
        yield self.env.timeout(at_s)
        self.slow[w] = factor
        if self.computing[w] and self.alive[w]:
            self.procs[w].interrupt("slowdown")

    def _failure(self, w: int, at_s: float) -> Any:
        yield self.env.timeout(at_s)
        if not self.alive[w] or self.finished.triggered:
            return
        self.alive[w] = False
        if self.procs[w].is_alive:  # (one whose last compute is done has ended: nothing to stop)
            self.procs[w].interrupt("fail")
        failed_at = self.env.now
        rec = {"worker": self.c.workers[w], "failed_at_s": failed_at, "detected_at_s": None, "lost_s": None}
        self.failures.append(rec)
        if self.sync != "bsp":
            rec["detected_at_s"], rec["lost_s"] = failed_at, 0.0
            self.detected[w] = True
            self._ssp_release()
            return
        yield self.env.timeout(self.problem.job.failure_timeout_s)
        rec["detected_at_s"] = self.env.now
        rec["lost_s"] = self.env.now - failed_at
        self.members.discard(w)
        self.detected[w] = True
        for c in range(self.C):
            miss = self.missing[c]
            if w in miss:
                miss.discard(w)
                if not miss:
                    self._submit_apply(c)

    def _free_memory(self, w: int, at_s: float, frac: float) -> Any:
        yield self.env.timeout(at_s)
        self.free_frac[w] = frac

    # ---------------------------------------------------------- online scheduling
    def _adopt(self, w: int) -> None:
        """Worker w starts an iteration: it takes its pending share, if any."""
        rows = self.next_rows[w]
        if rows is None:
            return
        self.next_rows[w] = None
        (self.batch[w], self.fwd[w], self.bwd[w], self.pull_b[w], self.push_b[w],
         self.agg[w], self.apply_one[w], self.wbits[w]) = rows

    def _top_up(self, w: int, it: int, chunks: list[int]) -> Any:
        """Fetch the sparse rows a grown share needs beyond what the pulls carried."""
        evs = []
        for c in chunks:
            got = self.issued.pop((w, it, c), None)
            need = self.pull_b[w][c]
            if got is not None and need > got:
                ev = self.env.event()
                self._pull(w, it, c, need - got, ev)
                evs.append(ev)
        if evs:
            self.acct[w].advance(self.env.now)
            self.acct[w].state = _BLOCKED
            yield self.env.all_of(evs)

    def observation(self) -> Observation:
        """The Observation of the window since the previous rebalance call."""
        cl = self.problem.cluster
        share = {r.device: r.batch for r in self.plan_now.replicas}
        ws = tuple(
            WorkerStatus(device=dev, batch=share.get(dev, 0), compute_s=self.win_compute[w],
                         samples=self.win_samples[w], rate_sps=rate_sps(self.win_samples[w], self.win_compute[w]),
                         free_memory_bytes=cl.device(dev).type.memory_bytes * self.free_frac[w],
                         alive=not self.detected[w])
            for w, dev in enumerate(self.c.workers)
        )
        return Observation(self.env.now, len(self.iter_end), ws, self.problem.job.global_batch)

    def _rebalance(self) -> None:
        assert self.rebalance_fn is not None
        obs = self.observation()
        self.win_compute = [0.0] * self.N
        self.win_samples = [0] * self.N
        # Schedulers see every worker of the run, idle and dead ones with share 0.
        new = self.rebalance_fn(full_membership(self.plan_now, self.c.workers), obs)
        if new is None:
            return
        shares = accepted_shares(new, obs, self.problem.job.global_batch)
        full = full_membership(new, self.c.workers, shares)
        costs = self._stage(full)
        for w in range(self.N):
            self.next_pull[w] = costs.pull_bytes[w].tolist()
            wake = self.wake[w]
            if shares[w] > 0 and wake is not None and not wake.triggered:
                wake.succeed()
        self.plan_now = full
        self.rebalances += 1

    def _stage(self, plan: Plan) -> PlanCosts:
        """Cost rows of ``plan`` at the current width, taken by each worker at the
        next iteration it starts (a rebalance and a width change both go through here)."""
        costs = plan_costs(self.qproblem, plan)
        if costs.n_chunks != self.C or list(costs.chunk_shard) != self.chunk_shard:
            raise ValueError("a new plan or width must keep the PS shards and layer groups")
        bits = self.qproblem.job.quant_bits
        for w in range(self.N):
            self.next_rows[w] = (int(costs.batch[w]), costs.fwd_s[w].tolist(), costs.bwd_s[w].tolist(),
                                 costs.pull_bytes[w].tolist(), costs.push_bytes[w].tolist(),
                                 costs.agg_s[w].tolist(), costs.apply_one_s[w].tolist(), bits)
        self.apply_all = costs.apply_s.tolist()
        return costs

    # --------------------------------------------------------------------- run
    def run(self) -> RunResult:
        env = self.env
        # The first pulls (N x C messages) and the processes, made with the collector held off
        # as in the run, whose freeze then takes them: at the default threshold they met 12
        # collections, one of every generation-1 object (64w benchmark: ~2 ms; now none).
        with rare_gc():
            for w in range(self.N):
                for c in range(self.C):
                    self._pull(w, 0, c)
            self.slowed = {wi for d in self.problem.dynamics if d.slowdown is not None
                           and (wi := self._worker_index(d.worker)) is not None}
            self.procs = [_Process(env, self._worker(w)) for w in range(self.N)]
            for d in self.problem.dynamics:
                wi = self._worker_index(d.worker)
                if wi is None:
                    continue
                if d.fail:
                    env.process(self._failure(wi, d.at_s))
                elif d.slowdown is not None:
                    env.process(self._slowdown(wi, d.at_s, d.slowdown))
                if d.free_memory_frac is not None:
                    env.process(self._free_memory(wi, d.at_s, d.free_memory_frac))
        try:
            with rare_gc():
                run_until(env, self.finished)
        except RuntimeError:
            # The event queue ran dry before the job finished. Legitimate only
            # when every worker has died; anything else is a modelling bug.
            if any(self.alive):
                raise RuntimeError(
                    f"DES stalled at t={env.now} after {len(self.iter_end)} of {self.n_iter} iterations"
                ) from None
            self.incomplete = (f"every worker failed: {len(self.iter_end)} of {self.n_iter} "
                               "iterations completed")
        end = env.now
        for a in self.acct:
            a.advance(end) if a.state != _DONE else None
        return self._result(end)

    def _worker_index(self, inventory_index: int) -> int | None:
        dev_id = self.problem.cluster.devices[inventory_index].id
        try:
            return self.c.workers.index(dev_id)
        except ValueError:
            return None  # that device is not in the plan

    def _result(self, end: float) -> RunResult:
        cl, job = self.problem.cluster, self.problem.job
        devices = []
        for w, dev_id in enumerate(self.c.workers):
            d = cl.device(dev_id)
            a = self.acct[w]
            devices.append(DeviceUsage(dev_id, "worker", d.type.price_per_hour, d.type.power_w.idle,
                                       d.type.power_w.active, busy_s=a.compute, compute_s=a.compute,
                                       comm_s=a.comm, wait_s=a.wait))
        for s, sid in enumerate(self.c.shards):
            d = cl.device(sid)
            devices.append(DeviceUsage(sid, "ps", d.type.price_per_hour, d.type.power_w.idle,
                                       d.type.power_w.active, busy_s=self.servers[s].busy_s))
        extra: dict[str, Any] = {}
        if self.incomplete:
            extra["incomplete"] = self.incomplete
        if self.has_target and self.conv is not None and self.time_to_target is None:
            extra["target_not_reached"] = (
                f"loss {self.conv.loss(self.eff_samples):.6g} > target {job.target_loss} after "
                f"{len(self.iter_end)} iterations (cap: {TARGET_CAP} x the {job.iterations} BSP needs)")
        if self.sync != "bsp" and self.staleness:
            st = np.asarray(self.staleness)
            extra["staleness"] = {"mean": float(st.mean()), "max": int(st.max())}
        if self.trace is not None and self.trace.dropped:
            extra["trace_events_dropped"] = self.trace.dropped
        if self.online:
            extra["rebalances"] = self.rebalances
            extra["final_shares"] = {r.device: r.batch for r in self.plan_now.replicas}
        if self.qpolicy is not None:
            extra["quant_bits"] = [list(ch) for ch in self.quant_changes]
        if self.cpu is not None:
            # CPU seconds of the work handed to each hosted process over the run (HostCPU.cpu_s):
            # its compute (and a shard's work), and apart its messages' copies (its transport)
            cpu_s: dict[str, float] = {}
            for i, dev_id in enumerate((*self.c.workers, *self.c.shards)):
                if (k := self.proc[i]) is not None:
                    cpu_s[dev_id] = self.cpu.cpu_s[k]
                if (k := self.copier[i]) is not None:
                    cpu_s[f"{dev_id} transport"] = self.cpu.cpu_s[k]
            extra["host_cpu_s"] = cpu_s
            if self.host_messages:  # else no message went through the host: none counted
                extra["host_message_ends"] = {dev_id: self.msg_ends[i]
                                              for i, dev_id in enumerate((*self.c.workers, *self.c.shards))
                                              if self.proc[i] is not None}
        return RunResult(
            name=self.problem.name, evaluator="des", scheduler=self.plan.scheduler,
            seed=self.problem.seed, iter_end_s=list(self.iter_end), iter_samples=list(self.iter_samples),
            devices=devices, warmup=job.warmup_iterations, failures=self.failures, extra=extra,
            trace=self.trace.events if self.trace is not None else [], time_to_target_s=self.time_to_target,
            iter_loss=list(self.iter_loss) if self.conv is not None else None,
        )

