"""Closed-form evaluator of data-parallel plans, vectorised over workers with numpy.

BSP is evaluated as the max-plus recursion the DES executes, one iteration
at a time over arrays: pulls delivered -> forward and backward per layer
group -> pushes delivered -> each shard's FIFO of aggregation and update
tasks -> next pulls. Without link contention every step is the DES's own
arithmetic, so the two agree to float rounding. With fair sharing each
flow's rate is min(bw_src / k_src, bw_dst / k_dst), where k is the
time-averaged number of flows it overlaps on that link, found by a short
fixed-point iteration (the DES tracks the same sharing exactly). Once two
successive iterations take the same time, the rest are extrapolated, so the
cost is a few iterations whatever ``job.iterations`` is.

ASP and SSP use steady-state cycle times: a worker's cycle is its pull,
compute, push and PS service; throughput is sum(b_w / cycle_w) (ASP) or
sum(b_w) / max(cycle_w) (SSP), scaled down by the utilisation of the busiest
PS resource when that exceeds one.

Time to target (``job.target_loss``): the convergence model's effective
samples per unit time at the steady state. BSP: whole iterations of the
global batch at staleness 0, so the target falls at the end of iteration
ceil(n_target / (B * discount)). ASP/SSP: each worker's updates arrive at
b_w / cycle_w samples/s with a mean staleness of N - 1 (the other workers'
updates applied in between, one each).

Hosts (``cluster.hosts``): a steady-state approximation of the DES's core
sharing (:mod:`sim.des.hosts`), :func:`host_costs`: every process on a host
is taken to be runnable at once, so each one's compute (a worker's forward
and backward, a shard's aggregation and update) is stretched by 1 / its
threads' fair share of the cores with all of them and the background load
competing (``max(1, runnable threads / cores)`` without affinity). That is
exact while all compute together (BSP workers of equal speed) and
pessimistic where processes take turns (a shard working while the workers
wait); the DES tracks who is runnable when. A host with ``copy_Bps`` (message
copies cost CPU) caps each hosted process's link at what its copy threads get
when the processes of the host all exchange at once and nothing else runs:
one thread per message (a worker's S, a shard's N), each at its fair share.

Adaptive quantization (``job.quantization: adaptive``): the policy is run over
the modelled loss one global iteration at a time, each iteration taking the
steady time and effective samples of the plan evaluated at its width; see
:func:`_evaluate_adaptive`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.cluster import thread_rates
from sim.convergence import effective_to_target_iterations, model_tensor_elems
from sim.costmodel import PlanCosts, plan_costs
from sim.des.engine import TARGET_CAP
from sim.emulation import RuntimeEmulation, emulated_problem
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.plan import Plan, PlanKind, require_kind
from sim.problem import Problem, initial_free_memory_bytes
from sim.result import DeviceUsage, RunResult
from sim.scheduling import OnlineScheduler

#: An online scheduler is driven to its steady state by at most this many plan changes ...
MAX_REBALANCES = 20
#: ... or until this many rebalance calls in a row leave the plan as it is.
MAX_CALLS_WITHOUT_CHANGE = 200

_FIXED_POINT_PASSES = 16
_MVA_PASSES = 200  # at most this many passes of the ASP / SSP mean-value analysis


_SAMPLES = 48  # points per flow lifetime at which the link loads are read


def _load_at(a: np.ndarray, b: np.ndarray, m: np.ndarray, t: np.ndarray) -> np.ndarray:
    """k(t) = sum of m_j over intervals [a_j, b_j) that contain t (a link's load)."""
    oa, ob = np.argsort(a, kind="stable"), np.argsort(b, kind="stable")
    ca = np.concatenate([[0.0], np.cumsum(m[oa])])
    cb = np.concatenate([[0.0], np.cumsum(m[ob])])
    return ca[np.searchsorted(a[oa], t, side="right")] - cb[np.searchsorted(b[ob], t, side="right")]


def _flow_finish(start: np.ndarray, nbytes: np.ndarray, src: np.ndarray, dst: np.ndarray,
                 weight: tuple[np.ndarray, np.ndarray], bw: np.ndarray, fair: bool) -> np.ndarray:
    """Finish time (before latency) of flows started at ``start`` over links src -> dst.

    ``weight`` gives, per flow and per end (src, dst), how many identical flows
    it stands for on that link (workers are evaluated one per equivalence class).
    With fair sharing a flow's rate at time t is min(bw_src / k_src(t),
    bw_dst / k_dst(t)), the DES's rule, where k is a link's load given the
    current estimate of every flow's lifetime; it is averaged over samples of
    the flow's own lifetime, and lifetimes are iterated (damped) to a fixed
    point, at which each flow's integrated rate equals its size.
    """
    full = np.minimum(bw[src], bw[dst])
    finish = start + nbytes / full
    if not fair:
        return finish
    active = np.flatnonzero(nbytes > 0)
    if active.size == 0:
        return finish
    groups = []
    for links, m in zip((src, dst), weight):
        la = links[active]
        order = np.argsort(la, kind="stable")
        bounds = np.flatnonzero(np.diff(la[order])) + 1
        groups.append((links, m.astype(float), [active[order[i:j]] for i, j in zip(
            np.concatenate([[0], bounds]), np.concatenate([bounds, [len(order)]]))]))
    frac = (np.arange(_SAMPLES) + 0.5) / _SAMPLES
    for _ in range(_FIXED_POINT_PASSES):
        a, b = start[active], finish[active]
        when = a[:, None] + (b - a)[:, None] * frac[None, :]  # (active, samples)
        pos = np.empty(len(start), dtype=int)
        pos[active] = np.arange(active.size)
        rate = np.full(when.shape, np.inf)
        for links, m, sels in groups:
            for sel in sels:
                k = _load_at(start[sel], finish[sel], m[sel], when[pos[sel]].ravel())
                share = bw[links[sel[0]]] / np.maximum(k.reshape(len(sel), _SAMPLES), m[sel][:, None])
                rate[pos[sel]] = np.minimum(rate[pos[sel]], share)
        new = finish.copy()
        new[active] = a + nbytes[active] / rate.mean(axis=1)
        done = np.allclose(new, finish, rtol=1e-12, atol=0.0)
        # damped: the undamped map overshoots (longer lifetimes -> more overlap -> longer)
        finish = new if done else 0.5 * (finish + new)
        if done:
            break
    return finish


def _fifo(ready: np.ndarray, keys: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Completion times of one FIFO server serving tasks in (ready, key) order."""
    order = np.lexsort((keys, ready))
    r, c = ready[order], cost[order]
    done_sorted = np.empty_like(r)
    t = -np.inf
    for i in range(len(r)):  # sequential by nature; the DES does the same sums in this order
        t = (r[i] if r[i] > t else t) + c[i]
        done_sorted[i] = t
    done = np.empty_like(ready)
    done[order] = done_sorted
    return done


def _classes(c: PlanCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group identical workers: (representative index, inverse map, multiplicity)."""
    rows = np.hstack([c.fwd_s, c.bwd_s, c.pull_bytes, c.push_bytes, c.agg_s, c.worker_bw[:, None]])
    rows = np.ascontiguousarray(rows)
    view = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse, counts = np.unique(view, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")  # keep classes in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.ravel()], counts[order]


class _BSP:
    """The BSP recursion over arrays, one row per class of identical workers."""

    def __init__(self, problem: Problem, c: PlanCosts) -> None:
        self.c = c
        rep, self.inverse, mult = _classes(c)
        self.rep, self.mult = rep, mult.astype(float)
        K, S, C = len(rep), len(c.shards), c.n_chunks
        self.K, self.S, self.C = K, S, C
        self.fair = problem.cluster.network.sharing == "fair"
        self.fwd, self.bwd = c.fwd_s[rep], c.bwd_s[rep]
        self.pull_b, self.push_b = c.pull_bytes[rep], c.push_bytes[rep]
        self.agg = c.agg_s[rep]
        wbw = c.worker_bw[rep]
        self.bw = np.concatenate([wbw, wbw, c.shard_bw, c.shard_bw])
        k_idx = np.repeat(np.arange(K), C)
        self.c_idx = np.tile(np.arange(C), K)
        sh = c.chunk_shard[self.c_idx]
        ones, m = np.ones(K * C), self.mult[k_idx]
        self.pull_links = (2 * K + sh, K + k_idx, (m, ones))
        self.push_links = (k_idx, 2 * K + S + sh, (ones, m))
        self.groups = [np.flatnonzero(c.chunk_group == g) for g in range(c.n_groups)]
        self.lat = c.latency_s
        self.busy_shard = np.zeros(S)
        # (push start, arrival) per class and chunk of the latest iteration
        self.last_pushes: tuple[np.ndarray, np.ndarray] = (np.zeros((K, C)), np.zeros((K, C)))
        # first worker index of each class: ties on a shard are served by worker index
        self.key_w = rep

    def pulls(self, start_c: np.ndarray) -> np.ndarray:
        """(K, C) delivery times of pulls starting at ``start_c`` per chunk."""
        src, dst, wt = self.pull_links
        fin = _flow_finish(start_c[self.c_idx], self.pull_b.ravel(), src, dst, wt, self.bw, self.fair)
        return (fin + self.lat).reshape(self.K, self.C)

    def iteration(self, t: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """One iteration from class clocks ``t`` and pull deliveries ``R``.

        Returns the clocks after the last backward pass, each chunk's update
        time U, and the worker intervals: compute spans and own pushes in flight.
        """
        c = self.c
        P = np.empty((self.K, self.C))
        spans: list[tuple[np.ndarray, np.ndarray]] = []
        for g, chunks in enumerate(self.groups):
            if chunks.size:
                t = np.maximum(t, R[:, chunks].max(axis=1))
            spans.append((t, t + self.fwd[:, g]))
            t = t + self.fwd[:, g]
        for g in range(c.n_groups - 1, -1, -1):
            spans.append((t, t + self.bwd[:, g]))
            t = t + self.bwd[:, g]
            P[:, self.groups[g]] = t[:, None]
        src, dst, wt = self.push_links
        fin = _flow_finish(P.ravel(), self.push_b.ravel(), src, dst, wt, self.bw, self.fair)
        A = (fin + self.lat).reshape(self.K, self.C)
        U = np.empty(self.C)
        n_keys = len(c.workers) + 1
        for s in range(self.S):
            cs = np.flatnonzero(c.chunk_shard == s)
            if cs.size == 0:
                continue
            # aggregation tasks (identical workers back to back), then the update after the last
            ready = np.concatenate([A[:, cs].T.ravel(), A[:, cs].max(axis=0)])
            keys = np.concatenate([
                (cs[:, None] * n_keys + self.key_w[None, :]).ravel(),
                cs * n_keys + n_keys - 1,
            ])
            cost = np.concatenate([(self.agg[:, cs] * self.mult[:, None]).T.ravel(), c.apply_s[cs]])
            done = _fifo(ready, keys, cost)
            U[cs] = done[-cs.size:]
            self.busy_shard[s] += cost.sum()
        self.last_pushes = (P, A)
        return t, U, spans


def evaluate(problem: Problem, plan: Plan, scheduler: Any = None,
             emulation: RuntimeEmulation | None = None) -> RunResult:
    """Evaluate the data-parallel ``plan`` analytically; same RunResult schema as the DES.

    ``scheduler``: the object that made ``plan``. If it is an
    :class:`~sim.scheduling.OnlineScheduler`, the steady state of its rebalancing is
    evaluated instead: plan -> evaluate -> Observation of the modelled
    per-worker compute (one iteration per window; free memory at t = 0) ->
    rebalance, until the plan stops changing (``MAX_CALLS_WITHOUT_CHANGE``
    calls in a row return it unchanged or None) or after ``MAX_REBALANCES``
    changes. ``extra["rebalances"]`` counts the changes and
    ``extra["final_shares"]`` gives the plan evaluated.

    ``emulation``: the runtime on this machine; the evaluation is of
    :func:`sim.emulation.emulated_problem` (the emulation's CPU scales, serial
    messages and whole pulls are the DES's alone). None: a plain evaluation.

    Plans of another kind are refused (ValueError): :func:`sim.evaluate.evaluate`
    sends layer placements to :func:`sim.multistage.evaluate_analytic`.
    """
    require_kind(plan, PlanKind.DATA_PARALLEL, "sim.analytic.evaluate")
    if problem.job.sync == "allreduce":
        raise ValueError("sim.analytic.evaluate prices parameter-server plans; an all-reduce job is "
                         "sim.collective_analytic.evaluate's (sim.evaluate.evaluate picks it)")
    problem = emulated_problem(problem, emulation)
    return steady_state(problem, plan, scheduler, _evaluate, _compute_per_iteration)


def steady_state(problem: Problem, plan: Plan, scheduler: Any,
                 run: Callable[[Problem, Plan], RunResult],
                 compute_s: Callable[[Problem, Plan], dict[str, float]]) -> RunResult:
    """``run(problem, plan)``, or with an :class:`~sim.scheduling.OnlineScheduler` the run
    of the plan its rebalancing settles on (see :func:`evaluate`): each call observes
    every worker's modelled compute per iteration at its share (``compute_s(problem,
    working plan)``, by device id), its free memory at t = 0, everyone alive. Shared by
    the evaluators of data-parallel plans (PS here, all-reduce in :mod:`sim.collective`)."""
    if not isinstance(scheduler, OnlineScheduler):
        return run(problem, plan)
    workers = tuple(r.device for r in plan.replicas)
    current, result = full_membership(plan, workers), run(problem, plan)
    changes = calls = quiet = 0
    t_s = 0.0
    while changes < MAX_REBALANCES and quiet < MAX_CALLS_WITHOUT_CHANGE:
        calls += 1
        t_s += result.iteration_times()[-1] if result.iter_end_s else 0.0
        obs = _observation(problem, current, calls, t_s, compute_s)
        new = scheduler.rebalance(current, obs)
        shares = accepted_shares(new, obs, problem.job.global_batch) if new is not None else None
        if shares is None or shares == [r.batch for r in current.replicas]:
            quiet += 1
            continue
        quiet = 0
        changes += 1
        current = full_membership(new, workers, shares)  # type: ignore[arg-type]
        result = run(problem, _working(current))
    result.extra["rebalances"] = changes
    result.extra["final_shares"] = {r.device: r.batch for r in current.replicas}
    return result


def _evaluate(problem: Problem, plan: Plan) -> RunResult:
    if problem.job.quant_adaptive is not None:
        return _evaluate_adaptive(problem, plan)
    c = host_costs(problem, plan_costs(problem, plan))
    if problem.job.sync == "bsp":
        return _evaluate_bsp(problem, plan, c)
    return _async_steady(problem, plan, c)[0]


def host_costs(problem: Problem, c: PlanCosts) -> PlanCosts:
    """``c`` with each hosted process's compute stretched by its steady-state share of
    its host's cores, every process of the plan on that host runnable at once (see the
    module docstring); ``c`` itself when no process of the plan is on a host."""
    cl = problem.cluster
    procs = [(k, pl) for k, dev in enumerate((*c.workers, *c.shards)) if (pl := cl.placed(dev)) is not None]
    if not procs:
        return c
    N, S = len(c.workers), len(c.shards)
    stretch = np.array(cl.host_stretch([*c.workers, *c.shards]), dtype=float)
    bw = np.concatenate([c.worker_bw, c.shard_bw]).astype(float)
    for h, host in enumerate(cl.hosts):
        mine = [(k, pl) for k, pl in procs if pl.host == h]
        if mine and host.copy_Bps > 0:
            # message copies: every process's ends of one exchange at once, one copy thread
            # per message (a worker talks to the S shards, a shard to the N workers), and
            # nothing else runnable; a process's copies together cap its link
            streams = [S if k < N else N for k, _ in mine]
            rates = thread_rates(host.cores, host.background_threads,
                                 [(pl.affinity, n) for (_, pl), n in zip(mine, streams)])
            for (k, _), n, r in zip(mine, streams, rates):
                bw[k] = min(bw[k], n * r * host.copy_Bps)
    w, s = stretch[:N], stretch[N:][c.chunk_shard]
    return dataclasses.replace(c, fwd_s=c.fwd_s * w[:, None], bwd_s=c.bwd_s * w[:, None],
                               agg_s=c.agg_s * s[None, :], apply_s=c.apply_s * s,
                               apply_one_s=c.apply_one_s * s[None, :], worker_bw=bw[:N], shard_bw=bw[N:])


def bsp_time_to_target(problem: Problem, ends: list[float], batch: int) -> float | None:
    """BSP's time to ``job.target_loss`` from its iteration ends (extrapolated at the last
    iteration's time past them): whole iterations of ``batch`` samples at staleness 0,
    None without a target."""
    job = problem.job
    conv = job.convergence
    if job.target_loss is None or conv is None or not ends or batch <= 0:
        return None
    k = effective_to_target_iterations(conv, job.target_loss, batch, job.quant_bits, model_tensor_elems(job.model))
    if k <= len(ends):
        return float(ends[k - 1])
    d = ends[-1] - (ends[-2] if len(ends) > 1 else 0.0)
    return float(ends[-1] + (k - len(ends)) * d)


def _working(plan: Plan) -> Plan:
    """The plan without its idle (share 0) replicas."""
    return plan.with_shares({})


def _compute_per_iteration(problem: Problem, plan: Plan) -> dict[str, float]:
    """Each worker's modelled forward and backward seconds of one iteration (hosts included)."""
    c = host_costs(problem, plan_costs(problem, plan))
    return dict(zip(c.workers, (c.fwd_s.sum(axis=1) + c.bwd_s.sum(axis=1)).tolist()))


def _observation(problem: Problem, plan: Plan, iteration: int, t_s: float,
                 compute_s: Callable[[Problem, Plan], dict[str, float]]) -> Observation:
    """What a steady-state iteration of ``plan`` shows: each worker's modelled compute
    per iteration at its share, its free memory at t = 0, everyone alive."""
    compute = compute_s(problem, _working(plan))
    free = initial_free_memory_bytes(problem)
    ws = []
    for r in plan.replicas:
        t = compute.get(r.device, 0.0) if r.batch > 0 else 0.0
        ws.append(WorkerStatus(r.device, r.batch, t, r.batch if t > 0 else 0, rate_sps(r.batch, t),
                               free[r.device], True))
    return Observation(t_s, iteration, tuple(ws), problem.job.global_batch)


def _union(a: np.ndarray, b: np.ndarray) -> list[tuple[float, float]]:
    """Sorted disjoint union of intervals [a_i, b_i]."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(zip(a.tolist(), b.tolist())):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _minus(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """x minus y, both sorted disjoint interval lists."""
    out, j = [], 0
    for lo, hi in x:
        while j < len(y) and y[j][1] <= lo:
            j += 1
        k, cur = j, lo
        while k < len(y) and y[k][0] < hi:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def _measure_in(x: list[tuple[float, float]], windows: np.ndarray) -> np.ndarray:
    """Length of ``x`` inside each window [windows[i], windows[i+1]]."""
    if not x:
        return np.zeros(len(windows) - 1)
    a = np.array([p[0] for p in x])[:, None]
    b = np.array([p[1] for p in x])[:, None]
    lo, hi = windows[None, :-1], windows[None, 1:]
    return np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0.0, None).sum(axis=0)


def _evaluate_bsp(problem: Problem, plan: Plan, c: PlanCosts) -> RunResult:
    job = problem.job
    m = _BSP(problem, c)
    n_iter = job.iterations
    t = np.zeros(m.K)
    pull_start = np.zeros(m.C)
    R = m.pulls(pull_start)
    ends: list[float] = []
    # per class: intervals with the worker computing, and with its own messages in flight
    busy: list[tuple[np.ndarray, np.ndarray]] = []
    flight: list[tuple[np.ndarray, np.ndarray]] = []
    prev_d = None
    done = 0
    while len(ends) < n_iter:
        t0 = ends[-1] if ends else 0.0
        flight.append((np.broadcast_to(pull_start, R.shape), R))
        t, U, spans = m.iteration(t, R)
        busy.extend(spans)
        flight.append(m.last_pushes)
        ends.append(float(U.max()))
        done = len(ends)
        d = ends[-1] - t0
        if prev_d is not None and abs(d - prev_d) <= 1e-12 * d and done < n_iter:
            # periodic from here on: the remaining iterations repeat the last one
            last = ends[-1]
            ends.extend([last + d * k for k in range(1, n_iter - done + 1)])
            m.busy_shard *= n_iter / done
            break
        prev_d = d
        if done < n_iter:
            pull_start = U
            R = m.pulls(U)
    T = ends[-1]
    compute_it = c.fwd_s.sum(axis=1) + c.bwd_s.sum(axis=1)
    compute = compute_it * n_iter
    # comm: time a worker is not computing while one of its own messages is in flight
    windows = np.array([0.0] + ends[:done])
    comm_k = np.empty(m.K)
    for k in range(m.K):
        exposed = _minus(_union(np.concatenate([a[k] for a, _ in flight]),
                                np.concatenate([b[k] for _, b in flight])),
                         _union(np.array([a[k] for a, _ in busy]), np.array([b[k] for _, b in busy])))
        per = _measure_in(exposed, windows)
        comm_k[k] = per.sum() + (n_iter - done) * per[-1]
    comm = comm_k[m.inverse]
    devices = _devices(problem, c, compute, comm, T - compute - comm, m.busy_shard)
    return RunResult(
        name=problem.name, evaluator="analytic", scheduler=plan.scheduler, seed=problem.seed,
        iter_end_s=ends, iter_samples=[int(c.batch.sum())] * len(ends), devices=devices,
        warmup=job.warmup_iterations, extra=dyn_note(problem),
        time_to_target_s=bsp_time_to_target(problem, ends, int(c.batch.sum())),
    )


def _async_steady(problem: Problem, plan: Plan, c: PlanCosts) -> tuple[RunResult, float]:
    """ASP / SSP by approximate mean-value analysis (Bard-Schweitzer).

    Workers are customers of a closed queueing network: compute and latency
    are delays; each shard's uplink, downlink and processor is a station
    shared by every worker (processor sharing for links, FIFO for the
    processor; with one customer per class both give R = D * (1 + queue
    seen)). A worker talks to all shards in parallel, so its demand at the
    shard tier is the largest per-shard demand, and its own NIC bounds each
    transfer from below. With pipelining only the round trip of the first
    layer's chunks is exposed, as long as the link can carry the volume.
    SSP: in steady state every worker runs at the slowest one's rate.
    (The cycle times: :func:`_mva_cycles`.)
    """
    job = problem.job
    N, S = len(c.workers), len(c.shards)
    compute = c.fwd_s.sum(axis=1) + c.bwd_s.sum(axis=1)
    service = c.agg_s + c.apply_one_s
    on = [c.chunk_shard == s for s in range(S)]
    per_shard = [lambda a, s=s: a[:, on[s]].sum(axis=1) for s in range(S)]
    cycle = _mva_cycles(problem, c, compute, service, per_shard)
    rate = float((c.batch / cycle).sum())
    B = job.global_batch
    d = B / rate
    warm = float(cycle.max())  # the first global batch also waits for the first pulls
    ends = [warm + k * d for k in range(job.iterations)]
    T = ends[-1]
    busy = compute * (T / cycle)
    comm_t = (T - busy) if not job.pipeline else np.maximum(T - busy, 0.0)
    shard_busy = np.array([float((per_shard[s](service) * T / cycle).sum()) for s in range(S)])
    devices = _devices(problem, c, busy, comm_t, np.zeros(N), shard_busy)
    extra = dyn_note(problem)
    ttt = None
    conv = job.convergence
    eff_rate = 0.0
    if conv is not None:
        d_el = model_tensor_elems(job.model)
        eff_rate = float(sum(conv.effective_samples(b / cy, b, N - 1, job.quant_bits, d_el)
                             for b, cy in zip(c.batch.tolist(), cycle.tolist()) if b > 0))
    if job.target_loss is not None and conv is not None and eff_rate > 0:
        ttt = warm + max(conv.effective_to_target(job.target_loss) / eff_rate - d, 0.0)
    res = RunResult(
        name=problem.name, evaluator="analytic", scheduler=plan.scheduler, seed=problem.seed,
        iter_end_s=ends, iter_samples=[B] * len(ends), devices=devices,
        warmup=job.warmup_iterations, extra=extra, time_to_target_s=ttt,
    )
    return res, eff_rate * d  # and the effective samples of one global iteration


def _mva_cycles(problem: Problem, c: PlanCosts, compute: np.ndarray, service: np.ndarray,
                per_shard: Sequence[Callable[..., np.ndarray]]) -> np.ndarray:
    """Each worker's steady cycle time (s) under ASP / SSP: the Bard-Schweitzer fixed point.

    Demands of a worker: its compute and two latencies (delays); the largest
    per-shard transfer up and down over the shards' shared links (with sharing
    "none": none, each chunk moving at its slower endpoint instead); the largest
    per-shard aggregation and update (``service``). Its own NIC bounds each
    transfer from below. ``per_shard[s](a)`` sums a [worker, chunk] array over
    shard s's chunks. The queue lengths are iterated, damped by half, until they
    settle (at most ``_MVA_PASSES`` passes).
    """
    job = problem.job
    N = len(c.workers)
    fair = problem.cluster.network.sharing == "fair"
    D_up = np.max([f(c.pull_bytes) / c.shard_bw[s] for s, f in enumerate(per_shard)], axis=0)
    D_dn = np.max([f(c.push_bytes) / c.shard_bw[s] for s, f in enumerate(per_shard)], axis=0)
    D_cpu = np.max([f(service) for f in per_shard], axis=0)
    own_up = c.pull_bytes.sum(axis=1) / c.worker_bw
    own_dn = c.push_bytes.sum(axis=1) / c.worker_bw
    if not fair:  # each chunk at its slower endpoint, chunks in parallel
        bw_pair = np.minimum(c.worker_bw[:, None], c.shard_bw[c.chunk_shard][None, :])
        own_up = (c.pull_bytes / bw_pair).max(axis=1)
        own_dn = (c.push_bytes / bw_pair).max(axis=1)
        D_up = np.zeros(N)
        D_dn = np.zeros(N)
    first = c.chunk_group == 0
    f1 = np.where(c.pull_bytes.sum(axis=1) > 0,
                  c.pull_bytes[:, first].sum(axis=1) / np.maximum(c.pull_bytes.sum(axis=1), 1e-300), 1.0)
    Z = compute + 2 * c.latency_s
    Q = np.zeros((3, N))
    cycle = Z + np.maximum(own_up, D_up) + np.maximum(own_dn, D_dn) + D_cpu
    for _ in range(_MVA_PASSES):
        seen = Q.sum(axis=1, keepdims=True) - Q  # queue each worker finds at each station
        R_up = np.maximum(own_up, D_up * (1 + seen[0]))
        R_dn = np.maximum(own_dn, D_dn * (1 + seen[1]))
        R_cpu = D_cpu * (1 + seen[2])
        comm = R_up + R_dn + R_cpu
        if job.pipeline:
            new = np.maximum(Z + f1 * comm, comm + 2 * c.latency_s)
        else:
            new = Z + comm
        if job.sync == "ssp":
            new = np.full(N, new.max())
        X = 1.0 / new
        Q_new = np.stack([X * R_up, X * R_dn, X * R_cpu])
        done = np.allclose(Q_new, Q, rtol=1e-10, atol=1e-12)
        Q = 0.5 * (Q + Q_new)
        cycle = new
        if done:
            break
    return cycle


def _evaluate_adaptive(problem: Problem, plan: Plan) -> RunResult:
    """``quantization: adaptive``: the policy run over the modelled loss, piecewise.

    The plan is evaluated at each width the policy visits (a fixed-width run of
    ``min(iterations, 64)`` iterations). The schedule then advances one global
    iteration at a time: its time is that width's steady iteration time (the
    first iteration: the start width's first, with the initial pulls), its
    effective samples that width's steady effective samples per iteration
    (BSP: the global batch at staleness 0; ASP/SSP: the steady effective rate
    times the iteration time), the loss the convergence model's at the running
    total; every ``quant_every`` iterations the loss is observed and the policy
    asked for the width, exactly as the DES does. Device times are each width's
    run scaled to the iterations spent at that width and summed. With
    ``target_loss`` the schedule stops at the iteration that reaches it (at most
    ``TARGET_CAP`` x ``iterations``).
    """
    job = problem.job
    conv = job.convergence
    assert job.quant_adaptive is not None and conv is not None
    runs = _WidthRuns(problem, plan)
    target = conv.effective_to_target(job.target_loss) if job.target_loss is not None else None
    n_max = job.iterations * TARGET_CAP if target is not None else job.iterations
    run = _adaptive_schedule(problem, runs, target, n_max)
    extra = dyn_note(problem)
    if target is not None and run.ttt is None:
        extra["target_not_reached"] = (
            f"loss {run.losses[-1]:.6g} > target {job.target_loss} after {len(run.ends)} iterations "
            f"(cap: {TARGET_CAP} x the {job.iterations} BSP needs)")
    extra["quant_bits"] = run.changes
    return RunResult(
        name=problem.name, evaluator="analytic", scheduler=plan.scheduler, seed=problem.seed,
        iter_end_s=run.ends, iter_samples=run.samples, devices=_scaled_devices(runs, run.counts),
        warmup=min(job.warmup_iterations, max(len(run.ends) - 1, 0)), extra=extra, time_to_target_s=run.ttt,
        iter_loss=run.losses,
    )


class _WidthRuns:
    """The plan evaluated at one fixed width, once per width: ``runs(bits)`` is the run of
    ``M = max(2, min(iterations, 64))`` iterations at ``bits`` and the effective samples of
    one of its steady global iterations (BSP: the global batch at staleness 0; ASP/SSP: the
    steady effective rate times the iteration time)."""

    def __init__(self, problem: Problem, plan: Plan) -> None:
        self.problem, self.plan = problem, plan
        self.M = max(2, min(problem.job.iterations, 64))
        self.d_el = model_tensor_elems(problem.job.model)
        self.runs: dict[int, tuple[RunResult, float]] = {}

    def __call__(self, bits: int) -> tuple[RunResult, float]:
        if bits not in self.runs:
            job, M = self.problem.job, self.M
            conv = job.convergence
            assert conv is not None
            jb = dataclasses.replace(job, quant_bits=bits, quant_adaptive=None, target_loss=None, iterations=M,
                                     warmup_iterations=min(job.warmup_iterations, M - 1))
            sub = dataclasses.replace(self.problem, job=jb)
            if job.sync == "bsp":
                r = _evaluate(sub, self.plan)
                B = r.iter_samples[-1]
                e = conv.effective_samples(B, B, 0.0, bits, self.d_el)
            else:
                r, e = _async_steady(sub, self.plan, host_costs(sub, plan_costs(sub, self.plan)))
            self.runs[bits] = (r, e)
        return self.runs[bits]


@dataclasses.dataclass
class _AdaptiveRun:
    """The piecewise schedule of an adaptive-width run (see :func:`_evaluate_adaptive`).

    Attributes:
        ends, samples, losses: per global iteration.
        counts: iterations spent at each width.
        changes: [iteration, bits] of the start width and of every change.
        ttt: the time the target loss was reached (None: not reached or no target).
    """

    ends: list[float]
    samples: list[int]
    losses: list[float]
    counts: dict[int, int]
    changes: list[list[int]]
    ttt: float | None


def _adaptive_schedule(problem: Problem, runs: _WidthRuns, target: float | None, n_max: int) -> _AdaptiveRun:
    """Advance one global iteration at a time at the width in force, ``n_max`` at most or
    until ``target`` effective samples; every ``quant_every`` iterations observe the loss
    and ask the policy for the width, as the DES does."""
    job = problem.job
    pol, conv = job.quant_adaptive, job.convergence
    assert pol is not None and conv is not None
    bits = pol.start_bits
    run = _AdaptiveRun([], [], [], {}, [[0, bits]], None)
    hist: list[float] = []
    t = eff = 0.0
    while len(run.ends) < n_max:
        r, e = runs(bits)
        times = r.iteration_times()
        t += float(times[0] if not run.ends else times[-1])
        run.ends.append(t)
        run.samples.append(int(r.iter_samples[-1]))
        run.counts[bits] = run.counts.get(bits, 0) + 1
        eff += e
        run.losses.append(float(conv.loss(eff)))
        k = len(run.ends)
        if target is not None and eff >= target * (1 - 1e-9):
            run.ttt = t
            break
        if k % job.quant_every == 0:
            hist.append(run.losses[-1])
            if not (pol.monotone and bits == pol.levels[-1]):
                q = pol.bits(k, hist)
                if q != bits:
                    bits = q
                    run.changes.append([k, q])
    return run


def _scaled_devices(runs: _WidthRuns, counts: dict[int, int]) -> list[DeviceUsage]:
    """Each device's times over the schedule: each width's run scaled to the iterations
    spent at that width, summed over the widths."""
    devices: dict[str, DeviceUsage] = {}
    for b, n in counts.items():
        r, _ = runs.runs[b]
        f = n / len(r.iter_end_s)
        for dv in r.devices:
            acc = devices.get(dv.id)
            if acc is None:
                acc = devices[dv.id] = DeviceUsage(dv.id, dv.role, dv.price_per_hour, dv.idle_w, dv.active_w)
            acc.busy_s += dv.busy_s * f
            acc.compute_s += dv.compute_s * f
            acc.comm_s += dv.comm_s * f
            acc.wait_s += dv.wait_s * f
    return list(devices.values())


def _devices(problem: Problem, c: PlanCosts, compute: np.ndarray, comm: np.ndarray,
             wait: np.ndarray, shard_busy: np.ndarray) -> list[DeviceUsage]:
    cl = problem.cluster
    out = []
    compute, comm, wait = compute.tolist(), comm.tolist(), np.maximum(wait, 0.0).tolist()
    for w, dev_id in enumerate(c.workers):
        t = cl.device(dev_id).type
        out.append(DeviceUsage(dev_id, "worker", t.price_per_hour, t.power_w.idle, t.power_w.active,
                               compute[w], compute[w], comm[w], wait[w]))
    for s, sid in enumerate(c.shards):
        t = cl.device(sid).type
        out.append(DeviceUsage(sid, "ps", t.price_per_hour, t.power_w.idle, t.power_w.active,
                               float(shard_busy[s])))
    return out


def dyn_note(problem: Problem) -> dict[str, object]:
    """The note of what a steady-state evaluator leaves out (dynamics, compute noise), as
    ``RunResult.extra``: {} when the problem has neither."""
    ignored = [what for what, present in (("dynamics (slowdowns, failures)", problem.dynamics),
                                           ("job.compute_noise", any(problem.job.compute_noise)))
               if present]
    if ignored:
        return {"note": f"the analytic evaluator is steady-state: {' and '.join(ignored)} are ignored"}
    return {}
