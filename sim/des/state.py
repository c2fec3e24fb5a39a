"""The state of one data-parallel DES run, and how it starts.

:class:`RunState` holds everything the run's parts share: the worker process
(:mod:`sim.des.worker`), the parameter-server side (:mod:`sim.des.ps`), online
scheduling and adaptive quantization (:mod:`sim.des.online`) and the dynamics
(:mod:`sim.des.dynamics`), each a mixin of :class:`sim.des.engine.DataParallelSim`
over this class. Workers are indexed ``w`` (plan order), shards ``s``, chunks ``c``
(a layer group's parameters on one shard), layer groups ``g``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import simpy

from sim.convergence import model_tensor_elems
from sim.costmodel import PlanCosts
from sim.des.accounting import WorkerTime
from sim.des.costrows import WorkerRows, worker_rows
from sim.des.kernel import Environment, Process
from sim.des.network import FlowNetwork
from sim.des.noise import noise_factors
from sim.des.shard import ShardServer
from sim.des.transport import Transport
from sim.emulation import RuntimeEmulation
from sim.observation import Observation
from sim.plan import Plan
from sim.problem import Problem
from sim.result import Trace
from sim.scheduling import OnlineScheduler

#: with a target loss, run at most this many times the iterations BSP would need
TARGET_CAP = 100
#: allocations between young-generation garbage collections while a run is in progress
GC_GEN0_DURING_RUN = 50_000


@contextmanager
def rare_gc() -> Iterator[None]:
    """Collect cyclic garbage rarely while an event loop runs.

    A run allocates millions of short-lived objects (events, heap entries,
    closures) that reference counting frees as soon as they fire; few form
    cycles (an online rebalance's plan objects). At Python's default threshold
    the cyclic collector runs every 700 allocations, and its older generations
    rescan the run's whole state, which grows with workers x chunks. Every
    50,000 allocations still reclaims those cycles. The objects that exist when
    the run starts (the problem, its costs, whatever the caller holds) are
    frozen (``gc.freeze``) for the run, so a full collection during it scans
    only what the run allocated; they are unfrozen after it (unless the caller
    had frozen objects itself: then nothing is frozen or unfrozen here).
    Garbage collection never changes what the simulation computes, only when
    memory is freed. The threshold is process-wide, so it is restored however
    the run ends (and a threshold of 0, collection switched off, is left alone).
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


class RunState:
    """What one run of a single-stage plan shares; see the module docstring."""

    # the run's inputs and its event kernel
    problem: Problem
    plan: Plan
    c: PlanCosts
    env: Environment
    N: int  # workers
    S: int  # shards
    C: int  # chunks
    G: int  # layer groups
    n_iter: int  # global iterations to run (with a target loss: the cap)
    sync: str  # "bsp", "asp" or "ssp"
    trace: Trace | None
    on_iteration: Callable[[int], None] | None
    # links and hosts (see Transport); process ids: workers 0..N-1, then shards N..N+S-1
    tx: Transport
    net: FlowNetwork  # tx.net
    host_messages: bool  # tx.host_messages: messages go through tx.send (else net.transfer)
    proc: list[int | None]  # each process's id on the hosts' cores (tx.proc)
    servers: list[ShardServer]
    chunk_server: list[ShardServer]  # each chunk's shard's server
    flow: list[Any]  # the host flow of each worker's compute in progress (cancelled if it fails)
    noise: list[Iterator[float] | None]  # job.compute_noise: each worker's factors (None: none)
    groups: list[list[int]]  # the chunks of each layer group
    # the cost rows each worker runs (see WorkerRows; ``next_rows`` below: its pending ones)
    batch: list[int]
    fwd: list[list[float]]
    bwd: list[list[float]]
    quant: list[list[float]]  # of each group's bwd, the seconds quantizing its gradient (the trace's quant span)
    pull_b: list[list[float]]
    push_b: list[list[float]]
    agg: list[list[float]]
    apply_one: list[list[float]]
    wbits: list[int]  # gradient bits of the iteration each worker runs
    apply_all: list[float]  # shard seconds to apply each chunk's update (BSP)
    chunk_shard: list[int]
    chunk_up: list[int]  # link ids of each chunk's shard's uplink and downlink
    chunk_down: list[int]
    # pushes layer-wise but pulls whole (an emulation's pipeline_pulls false, the runtime's way): a
    # worker's chunks leave the shards together once all are applied, and its forward
    # waits for all of them
    pull_whole: bool
    # serial messages (an emulation's serial_messages): when each worker's last push of
    # the BSP iteration arrived, its pull's request; the shard answers in that order, as the
    # runtime's does (None: pulls go out in worker order, all at once)
    asked_at: list[float] | None
    # each worker's state
    slow: list[float]  # its compute slowdown
    alive: list[bool]
    computing: list[bool]  # in a compute that a slowdown may interrupt
    acct: list[WorkerTime]
    advance: list[Callable[[float, int, int], None]]  # each worker's acct[w].advance, bound once
    # ready[w][c]: chunk c's parameters for the next iteration w runs: True when they
    # arrived before w asked (no event needed), the event w waits on when it asked
    # first, None when neither happened yet; cleared when the worker takes it. One
    # slot per (w, c) is enough: a chunk's next pull to w is issued only after w's
    # gradient of that chunk (or its abstention) reached the shard, i.e. after w
    # took the slot.
    ready: list[list[simpy.Event | bool | None]]
    slowed: set[int]  # the workers a slowdown can interrupt
    procs: list[Process]
    # trace labels, built once
    pull_label: list[str]
    push_label: list[str]
    agg_label: list[str]
    apply_label: list[str]
    # results so far
    iter_end: list[float]
    iter_samples: list[int]
    failures: list[dict[str, Any]]
    finished: simpy.Event
    incomplete: str
    # BSP: the barrier group (a worker leaves once its failure is detected: a set, which each
    # applied chunk's barrier copies), each chunk's iteration and the workers it waits for
    members: set[int]
    chunk_iter: list[int]
    missing: list[set[int]]
    applied_in_iter: dict[int, int]
    samples_in_iter: dict[int, int]
    bits_in_iter: dict[int, dict[int, int]]  # iteration -> bits -> samples
    # ASP/SSP: chunk versions, each worker's pulled versions and iterations completed
    version: list[int]
    pulled_version: list[list[int]]
    staleness: list[int]
    worker_chunks_applied: dict[tuple[int, int], int]
    samples_applied: int
    completed: list[int]
    ssp_waiters: list[tuple[int, simpy.Event]]
    # online scheduling: ``next_rows`` is the share (its cost rows) a worker takes at the
    # next iteration it starts; the rows above are the ones it runs
    rebalance_fn: Callable[[Plan, Observation], Plan | None] | None
    online: bool
    plan_now: Plan
    next_rows: list[WorkerRows | None]
    next_pull: list[list[float]]
    issued: dict[tuple[int, int, int], float]
    win_compute: list[float]  # compute in the window since the last rebalance (counted online only)
    win_samples: list[int]
    free_frac: list[float]
    detected: list[bool]
    idle: list[bool]
    wake: list[simpy.Event | None]
    rebalances: int
    # effective samples and the modelled loss (whenever a convergence model is present)
    conv: Any
    has_target: bool
    eff_samples: float
    eff_target: float
    time_to_target: float | None
    stale_sum: dict[tuple[int, int], int]
    iter_loss: list[float]
    tensor_elems: Any
    # adaptive quantization: the width follows the modelled loss
    qpolicy: Any
    adopting: bool  # a worker may take new rows (online or adaptive quantization)
    qproblem: Problem  # the problem at the current width (plan_costs input)
    loss_history: list[float]
    quant_changes: list[tuple[int, int]]
    # A shard task's key (its order among tasks ready at one instant) is (chunk, worker),
    # the update after every worker (N) of its chunk: as one int, c * (N + 1) + w.
    key_base: int
    # Delivery callbacks made once per (worker, chunk) rather than per message, where a
    # delivery needs nothing else: no trace (the send time), and for pushes BSP (no
    # iteration) with fixed shares and widths (the aggregation cost of the share).
    pulled_cb: list[list[Callable[[], None]]] | None
    pushed_cb: list[list[Callable[[], None]]] | None
    # Where the network alone carries them and the pulls' sizes are fixed (no online
    # shares), each chunk's pull to every worker as (dst link, bytes, delivery) rows, made
    # once and started in one FlowNetwork.transfer_many call (see ParameterServer._pull_all).
    pull_rows: list[list[tuple[int, float, Callable[[], None]]]] | None

    # Every attribute declared above is a slot: an attribute of the run is read as a slot
    # (not through an instance dict of a hundred keys), and a method of it is found
    # without looking in one. The mixins add none.
    __slots__ = tuple(__annotations__)

    def __init__(self, problem: Problem, plan: Plan, costs: PlanCosts, trace: bool = True,
                 on_iteration: Callable[[int], None] | None = None, scheduler: Any = None,
                 emulation: RuntimeEmulation | None = None) -> None:
        self.problem, self.plan, self.c = problem, plan, costs
        self.env = env = Environment()
        job = problem.job
        N, S, C = len(costs.workers), len(costs.shards), costs.n_chunks
        self.N, self.S, self.C, self.G = N, S, C, costs.n_groups
        self.n_iter = job.iterations
        self.sync = job.sync
        self.trace = Trace() if trace else None
        self.on_iteration = on_iteration
        self.tx = Transport(env, problem, costs, emulation)
        self.net, self.host_messages, self.proc = self.tx.net, self.tx.host_messages, self.tx.proc
        self.servers = [ShardServer(env, self._span_cb(s) if trace else None, self._shard_run(s)) for s in range(S)]
        self.flow = [None] * N
        index = {d.id: i for i, d in enumerate(problem.cluster.devices)}
        rel = dict(zip((d.id for d in problem.cluster.devices), problem.job.compute_noise))
        self.noise = [noise_factors(problem.seed, index[dev], rel[dev]) if rel.get(dev, 0.0) > 0 else None
                      for dev in costs.workers]
        self.groups = [[] for _ in range(self.G)]
        for c_, g in enumerate(costs.chunk_group):
            self.groups[int(g)].append(c_)
        self._init_rows(costs, emulation is None or emulation.pipeline_pulls)
        self.asked_at = [0.0] * N if emulation is not None and emulation.serial_messages else None
        self._init_sync()
        self._init_online(plan, scheduler)
        self.key_base = N + 1
        self.chunk_server = [self.servers[s] for s in self.chunk_shard]
        # N x C objects of each kind, made with the collector held off as in a run (at the
        # default threshold it would rescan everything alive ~every 700 of them)
        with rare_gc():
            self._init_callbacks()

    def _init_rows(self, costs: PlanCosts, pipeline_pulls: bool) -> None:
        """The cost rows each worker starts with, each worker's state, labels and link ids
        (``pipeline_pulls``: see :attr:`sim.emulation.RuntimeEmulation.pipeline_pulls`)."""
        job, N, S, C = self.problem.job, self.N, self.S, self.C
        rows = worker_rows(costs, job.quant_bits)
        self.batch = [r.batch for r in rows]
        self.fwd = [r.fwd for r in rows]
        self.bwd = [r.bwd for r in rows]
        self.quant = [r.quant for r in rows]
        self.pull_b = [r.pull for r in rows]
        self.push_b = [r.push for r in rows]
        self.agg = [r.agg for r in rows]
        self.apply_one = [r.apply_one for r in rows]
        self.wbits = [r.bits for r in rows]
        self.apply_all = costs.apply_s.tolist()
        self.chunk_shard = [int(s) for s in costs.chunk_shard]
        self.pull_whole = job.pipeline and not pipeline_pulls and C > 1
        self.slow = [1.0] * N
        self.alive = [True] * N
        self.computing = [False] * N
        self.acct = [WorkerTime() for _ in range(N)]
        self.advance = [a.advance for a in self.acct]
        self.ready = [[None] * C for _ in range(N)]
        self.slowed = set()
        self.procs = []
        self.pull_label = [f"pull c{c}" for c in range(C)]
        self.push_label = [f"push c{c}" for c in range(C)]
        self.agg_label = [f"agg c{c}" for c in range(C)]
        self.apply_label = [f"apply c{c}" for c in range(C)]
        self.chunk_up = [2 * N + s for s in self.chunk_shard]
        self.chunk_down = [2 * N + S + s for s in self.chunk_shard]
        self.iter_end = []
        self.iter_samples = []
        self.failures = []
        self.finished = self.env.event()
        self.incomplete = ""

    def _init_sync(self) -> None:
        """The state of the synchronisation: BSP's barriers, ASP/SSP's versions."""
        N, C = self.N, self.C
        self.members = set(range(N))
        self.chunk_iter = [0] * C
        self.missing = [set(range(N)) for _ in range(C)]
        self.applied_in_iter = {}
        self.samples_in_iter = {}
        self.bits_in_iter = {}
        self.version = [0] * C
        self.pulled_version = [[0] * C for _ in range(N)]
        self.staleness = []
        self.worker_chunks_applied = {}
        self.samples_applied = 0
        self.completed = [0] * N
        self.ssp_waiters = []

    def _init_online(self, plan: Plan, scheduler: Any) -> None:
        """Online scheduling, the convergence model and adaptive quantization."""
        job, N = self.problem.job, self.N
        self.rebalance_fn = scheduler.rebalance if isinstance(scheduler, OnlineScheduler) else None
        self.online = self.rebalance_fn is not None
        self.plan_now = plan
        self.next_rows = [None] * N
        self.next_pull = list(self.pull_b)
        self.issued = {}
        self.win_compute = [0.0] * N
        self.win_samples = [0] * N
        self.free_frac = [1.0] * N
        self.detected = [False] * N
        self.idle = [False] * N
        self.wake = [None] * N
        self.rebalances = 0
        target = job.target_loss
        self.conv = job.convergence
        self.has_target = target is not None and self.conv is not None
        self.eff_samples = 0.0
        self.time_to_target = None
        self.stale_sum = {}
        self.iter_loss = []
        if self.conv is not None:
            self.tensor_elems = model_tensor_elems(job.model)
        if self.has_target:
            assert self.conv is not None and target is not None
            self.n_iter = job.iterations * TARGET_CAP
            self.eff_target = self.conv.effective_to_target(target)
        self.qpolicy = job.quant_adaptive
        self.adopting = self.online or self.qpolicy is not None
        self.qproblem = self.problem
        self.loss_history = []
        self.quant_changes = [(0, job.quant_bits)]

    def _init_callbacks(self) -> None:
        """The delivery callbacks made once (``pulled_cb``, ``pushed_cb``, ``pull_rows``)."""
        self.pulled_cb = self.pushed_cb = self.pull_rows = None
        N, C = self.N, self.C
        if self.trace is None:
            # partials of the plain functions with self first: no bound method in between
            pulled, pushed = type(self)._pulled, type(self)._pushed_bsp  # type: ignore[attr-defined]
            self.pulled_cb = [[partial(pulled, self, w, c) for c in range(C)] for w in range(N)]
            if self.sync == "bsp" and not self.adopting:
                self.pushed_cb = [[partial(pushed, self, w, c, agg) for c, agg in enumerate(self.agg[w])]
                                  for w in range(N)]
        if (self.pulled_cb is not None and not self.online and not self.host_messages
                and self.sync == "bsp" and not self.pull_whole):  # where _pull_all starts them in one call
            cbs = self.pulled_cb
            self.pull_rows = [[(N + w, self.next_pull[w][c], cbs[w][c]) for w in range(N)] for c in range(C)]

    def _shard_run(self, s: int) -> Callable[[float, Callable[[], None]], object] | None:
        """How shard s executes its work: on its host's cores, or None (a plain timeout)."""
        cpu, k = self.tx.cpu, self.proc[self.N + s]
        if cpu is None or k is None:
            return None
        return lambda cost, done: cpu.compute(k, cost, done)

    def _span_cb(self, s: int) -> Any:
        def cb(label: str, t0: float, t1: float) -> None:
            assert self.trace is not None
            self.trace.span("ps", s, self.c.shards[s], label, t0, t1)
        return cb
