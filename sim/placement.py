"""Problem B (HeterPS): layer placement and provisioning, as a steady-state model.

A placement assigns each layer a device type; consecutive layers of one type
form a *stage* (a contiguous layer range). Stage s on type k with n replicas
splits the global batch B over its replicas (``b = ceil(B / n)`` for the
largest share) and per iteration:

* computes forward and backward of its layers on b samples (the cost model);
* exchanges with the PS its layers' parameters: pulls the dense parameters
  and the touched sparse rows (fp32), pushes their gradients (quantized to the
  job's bits); without ``job.pipeline`` that transfer adds to the iteration
  (``(pull + push) / nic + 2 * latency``), with it it overlaps compute;
* sends its output activations forward and receives their gradients back
  (and the mirror image at its input boundary): ``b * act_bytes`` per
  boundary and direction, overlapped with compute (micro-batches in flight).

Its throughput is the smaller of what compute and what its replicas' NICs
allow (each NIC direction carries the PS traffic plus the boundary traffic):

    T_s(n) = min( B / t_iter(b),  B * nic / max(up_bytes, down_bytes) )

The PS shards' NICs carry every stage's PS traffic: ``T_ps = shards *
ps_nic / sum_s ps_bytes_per_sample_s`` (``ps_bytes_per_sample = n *
dense_bytes / B + sparse_bytes``, the larger of the pull and push
direction). The plan's throughput is ``T = min(min_s T_s, T_ps)``.

Provisioning gives each stage the fewest replicas (within the inventory and
each replica's memory) whose ``T_s`` meets ``objective.throughput_min``. The
cost of processing the job's samples is ``(sum_s n_s * price_k + PS shards'
price) * samples / T / 3600``; energy counts idle power over the run plus
active-minus-idle power for the busy fraction ``T / T_compute_s``.

:class:`PlacementSpace` precomputes every (segment, type, replicas) option
as numpy arrays, so :meth:`PlacementSpace.evaluate` scores thousands of
placements per second and the exact solvers (schedulers/exact.py) work on
the same numbers. A stage's boundary traffic is charged to its own replicas'
NICs (both sides of a boundary carry it), which keeps every stage's
throughput independent of its neighbours' replica counts.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hardware_profiles.errors import HetsimError
from sim.costmodel import _ACT_SCALE, layer_times, sparse_touched_bytes
from sim.plan import Plan, PlanKind, Replica, Stage
from sim.problem import Problem
from sim.quantization import packed_bytes_array

#: Upper bound on the replicas of one stage considered by the model.
MAX_REPLICAS = 64


class PlacementInfeasible(HetsimError):
    """No placement meets the throughput constraint; the message names the bottleneck."""


@dataclass(frozen=True)
class Evaluation:
    """Scores of P placements (arrays of length P; infeasible ones have cost = inf).

    Attributes:
        throughput_sps: steady-state samples/s (0 where a stage cannot be provisioned).
        rate_usd_h: provisioned devices' and shards' price per hour.
        cost_usd: ``rate * samples / throughput / 3600``.
        energy_j: energy of processing the job's samples.
        feasible: meets throughput_min, the inventory and memory.
        stages: number of stages of each placement.
        provisioned: every stage could be provisioned (memory, throughput_min).
        inventory_ok: the provisioned replicas fit the inventory.
        explain: the bottleneck of placement p as text (see :attr:`bottleneck`).
    """

    throughput_sps: np.ndarray
    rate_usd_h: np.ndarray
    cost_usd: np.ndarray
    energy_j: np.ndarray
    feasible: np.ndarray
    stages: np.ndarray
    provisioned: np.ndarray
    inventory_ok: np.ndarray
    explain: Callable[[int], str] = field(repr=False, compare=False)

    @functools.cached_property
    def bottleneck(self) -> list[str]:
        """Per placement: 'stage i (layers a-b) cannot be provisioned' | 'inventory TYPE' |
        'ps' | 'stage i' (the slowest stage). Built on first use: the searches need only
        the arrays."""
        return [self.explain(p) for p in range(self.throughput_sps.size)]


class PlacementSpace:
    """Every (segment, device type, replica count) option of one Problem, precomputed.

    Segments are the L(L+1)/2 layer ranges ``[j, i)``; ``seg_index[j, i]``
    gives a segment's row. For each (segment, type, n) the arrays hold the
    stage throughput and its PS load; :meth:`provision` picks, per (segment,
    type), the fewest replicas meeting a throughput target.

    Args:
        problem: the problem; its cluster inventory gives the types and counts,
            ``objective.throughput_min`` the provisioning target (None: 0).
        max_replicas: cap on replicas per stage (also capped by the inventory
            and the global batch).
        optimizer_state_copies: parameter-sized optimizer buffers per replica
            (memory feasibility).
    """

    def __init__(self, problem: Problem, max_replicas: int = MAX_REPLICAS,
                 optimizer_state_copies: int = 1) -> None:
        job, cluster = problem.job, problem.cluster
        model = job.model
        self.problem = problem
        self.L = L = len(model.layers)
        self.B = B = job.global_batch
        self.samples = float(job.iterations * B)
        tmin = problem.objective.throughput_min
        self.throughput_min = float(tmin) if tmin else 0.0
        counts = Counter(d.type.name for d in cluster.devices)
        types = cluster.types
        self.type_names: tuple[str, ...] = tuple(types)
        self.kinds = tuple(types[k].kind for k in self.type_names)
        self.K = K = len(self.type_names)
        self.counts = np.array([counts[k] for k in self.type_names], dtype=int)
        self.price = np.array([types[k].price_per_hour for k in self.type_names])
        self.idle_w = np.array([types[k].power_w.idle for k in self.type_names])
        self.active_w = np.array([types[k].power_w.active for k in self.type_names])
        nic_of = {d.type.name: d.nic_bw_Bps for d in reversed(cluster.devices)}
        self.nic = np.array([nic_of[k] for k in self.type_names])
        self.N = N = max(1, min(int(self.counts.max()), B, max_replicas))
        lat = cluster.network.latency_s

        # per-layer facts, prefix sums over layers
        scale = _ACT_SCALE.get(job.dtype, 1.0)
        act = np.array([ly.activation_bytes * scale for ly in model.layers])
        dense = np.array([0.0 if ly.sparse else ly.param_bytes for ly in model.layers])
        cum = lambda a: np.concatenate([[0.0], np.cumsum(a)])  # noqa: E731
        c_dense, c_act = cum(dense), cum(act)

        jj, ii = np.triu_indices(L + 1, k=1)  # segments [j, i), j < i
        self.seg_j, self.seg_i = jj, ii
        self.S = S = jj.size
        self.seg_index = np.full((L + 1, L + 1), -1, dtype=int)
        self.seg_index[jj, ii] = np.arange(S)
        d_bytes = c_dense[ii] - c_dense[jj]                  # (S,)
        act_in = np.where(jj > 0, act[np.maximum(jj - 1, 0)], 0.0)
        act_out = np.where(ii < L, act[ii - 1], 0.0)
        boundary = act_in + act_out                          # bytes/sample each direction
        act_mem = c_act[ii] - c_act[jj]

        n = np.arange(1, N + 1)
        b = np.ceil(B / n).astype(int)                       # (N,) largest share
        self.n_grid, self.b_grid = n, b
        compute = np.empty((S, K, N))
        for k, name in enumerate(self.type_names):
            dev = types[name]
            for m, bm in enumerate(b):
                f, w = layer_times(model, dev, job.dtype, int(bm), job.memory_format)
                c = cum(f + w)
                compute[:, k, m] = c[ii] - c[jj]
        # PS traffic per replica and iteration: pull fp32, push quantized
        # touched sparse rows, each table capped at its size on its own
        per_layer = np.array([[sparse_touched_bytes(ly, float(bm)) for bm in b] for ly in model.layers])
        c_touched = np.vstack([np.zeros((1, N)), np.cumsum(per_layer, axis=0)])   # (L+1, N)
        touched = c_touched[ii] - c_touched[jj]                                    # (S, N)
        pull, push, sync, wire = replica_traffic(
            d_bytes[:, None, None], touched[:, None, :], boundary[:, None, None] * b[None, None, :],
            job.quant_bits, self.nic[None, :, None], lat, job.pipeline)   # pull, push: (S, 1, N)
        period = np.maximum(compute + sync, wire)            # (S, K, N) seconds per iteration
        with np.errstate(divide="ignore"):
            self.stage_tput = np.where(period > 0, B / period, np.inf)
        self.stage_busy = compute                            # seconds of compute per iteration
        self.ps_load = np.broadcast_to(np.maximum(pull, push) / B * n[None, None, :], (S, K, N))
        # a replica holds its dense parameters with their gradients and optimizer
        # state, the sparse rows it touched (the tables live on the PS) with their
        # gradients, and every activation of its layers for the backward pass
        mem_need = (d_bytes[:, None] * (2 + optimizer_state_copies) + 2 * touched
                    + act_mem[:, None] * b[None, :])                       # (S, N)
        memory = np.array([types[k].memory_bytes for k in self.type_names])
        self.fits = (mem_need[:, None, :] <= memory[None, :, None]) & \
            (n[None, None, :] <= self.counts[None, :, None])
        shards = cluster.shards
        self.ps_capacity = float(sum(s.nic_bw_Bps for s in shards))
        self.ps_rate = float(sum(s.type.price_per_hour for s in shards))
        self.ps_idle_w = float(sum(s.type.power_w.idle for s in shards))
        self.provision(self.throughput_min)

    # ---- provisioning ---------------------------------------------------------
    def provision(self, target_sps: float) -> None:
        """Per (segment, type): the fewest replicas whose stage throughput meets ``target_sps``.

        Sets ``n`` (0 where none does), ``tput``, ``rate`` (USD/h; inf where
        none does), ``ps`` (PS bytes per sample) and ``busy`` (compute seconds
        per iteration of the largest share), each of shape (S, K).
        """
        ok = self.fits & (self.stage_tput >= target_sps)
        any_ok = ok.any(axis=2)
        first = np.argmax(ok, axis=2)                         # index of the fewest replicas
        s_idx, k_idx = np.indices(first.shape)
        self.n = np.where(any_ok, first + 1, 0)
        self.tput = np.where(any_ok, self.stage_tput[s_idx, k_idx, first], 0.0)
        self.rate = np.where(any_ok, self.n * self.price[None, :], np.inf)
        self.ps = np.where(any_ok, self.ps_load[s_idx, k_idx, first], 0.0)
        self.busy = np.where(any_ok, self.stage_busy[s_idx, k_idx, first], 0.0)
        self.target = float(target_sps)

    # ---- plans as per-layer type assignments ----------------------------------
    def stages_of(self, assignment: np.ndarray) -> list[tuple[int, int, int]]:
        """(first_layer, end_layer, type index) of each stage of one assignment."""
        a = np.asarray(assignment, dtype=int)
        starts = np.flatnonzero(np.concatenate([[True], a[1:] != a[:-1]]))
        ends = np.concatenate([starts[1:], [self.L]])
        return [(int(s), int(e), int(a[s])) for s, e in zip(starts, ends)]

    def evaluate(self, assignments: np.ndarray) -> Evaluation:
        """Score placements given as a (P, L) array of type indices (vectorised)."""
        A = np.atleast_2d(np.asarray(assignments, dtype=int))
        P, L = A.shape
        if L != self.L:
            raise ValueError(f"assignments have {L} layers, the model {self.L}")
        start = np.ones((P, L), dtype=bool)
        start[:, 1:] = A[:, 1:] != A[:, :-1]
        pi, li = np.nonzero(start)                            # stage starts, row-major
        nxt = np.empty_like(li)
        nxt[:-1] = li[1:]
        last = np.ones(li.size, dtype=bool)
        last[:-1] = pi[1:] != pi[:-1]
        nxt[last] = L
        k = A[pi, li]
        seg = self.seg_index[li, nxt]
        n, tput, rate, ps, busy = (self.n[seg, k], self.tput[seg, k], self.rate[seg, k],
                                   self.ps[seg, k], self.busy[seg, k])
        first = np.flatnonzero(np.concatenate([[True], pi[1:] != pi[:-1]]))
        n_stages = np.diff(np.concatenate([first, [pi.size]]))
        stage_min = np.minimum.reduceat(tput, first)
        provisioned = np.maximum.reduceat((n == 0).astype(int), first) == 0
        ps_sum = np.add.reduceat(ps, first)
        with np.errstate(divide="ignore"):
            t_ps = np.where(ps_sum > 0, self.ps_capacity / ps_sum, np.inf)
        T = np.where(provisioned, np.minimum(stage_min, t_ps), 0.0)
        rate_sum = np.add.reduceat(np.where(n > 0, rate, 0.0), first) + self.ps_rate
        used = np.zeros((P, self.K), dtype=int)
        np.add.at(used, (pi, k), n)
        inv_ok: np.ndarray = np.all(used <= self.counts[None, :], axis=1)
        feasible = provisioned & inv_ok & (T >= self.target * (1 - 1e-12)) & (T > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            elapsed = np.where(T > 0, self.samples / T, np.inf)
            cost = np.where(feasible, rate_sum * elapsed / 3600.0, np.inf)
            # busy fraction of each stage's replicas: T / (B / busy) = T * busy / B
            util = np.minimum(1.0, T[pi] * busy / self.B)
            watts = n * (self.idle_w[k] + (self.active_w[k] - self.idle_w[k]) * util)
            energy = np.where(feasible, (np.add.reduceat(watts, first) + self.ps_idle_w) * elapsed, np.inf)
        def explain(p: int) -> str:
            lo, hi = first[p], first[p] + n_stages[p]
            if not provisioned[p]:
                s = int(np.argmax(n[lo:hi] == 0))
                return f"stage {s} (layers {li[lo + s]}-{nxt[lo + s]}) cannot be provisioned"
            if not bool(inv_ok[p]):
                over = np.flatnonzero(used[p] > self.counts)
                return f"inventory {self.type_names[int(over[0])]}"
            if t_ps[p] <= stage_min[p]:
                return "ps"
            return f"stage {int(np.argmin(tput[lo:hi]))}"

        return Evaluation(T, rate_sum, cost, energy, feasible, n_stages, provisioned, inv_ok, explain)

    def evaluate_one(self, assignment: np.ndarray) -> dict[str, object]:
        ev = self.evaluate(np.asarray(assignment)[None, :])
        return {"throughput_sps": float(ev.throughput_sps[0]), "rate_usd_h": float(ev.rate_usd_h[0]),
                "cost_usd": float(ev.cost_usd[0]), "energy_j": float(ev.energy_j[0]),
                "feasible": bool(ev.feasible[0]), "bottleneck": ev.bottleneck[0]}

    def to_plan(self, assignment: np.ndarray, scheduler: str) -> Plan:
        """The Plan of a placement: provisioned replicas per stage, devices taken from the
        inventory in order, the global batch split evenly (largest remainder)."""
        from collections import defaultdict

        free: dict[str, list[str]] = defaultdict(list)
        for d in self.problem.cluster.devices:
            free[d.type.name].append(d.id)
        stages = []
        for j, i, k in self.stages_of(assignment):
            seg = self.seg_index[j, i]
            n = int(self.n[seg, k])
            name = self.type_names[k]
            if n == 0 or len(free[name]) < n:
                raise PlacementInfeasible(self.describe_infeasible(assignment))
            ids, free[name] = free[name][:n], free[name][n:]
            shares = even_split(self.B, n)
            stages.append(Stage(j, i, tuple(Replica(d, s) for d, s in zip(ids, shares)), name))
        ev = self.evaluate_one(assignment)
        options = {"placement": {"assignment": [self.type_names[int(k)] for k in assignment],
                                 "predicted": ev, "throughput_min": self.target}}
        return Plan(tuple(stages), tuple(s.id for s in self.problem.cluster.shards), scheduler, options,
                    PlanKind.PLACEMENT)

    def assignment_of(self, plan: Plan) -> np.ndarray:
        """The per-layer type indices of a placement plan (every stage of one type)."""
        out = np.empty(self.L, dtype=int)
        for st in plan.stages:
            t = st.device_type or self.problem.cluster.device(st.replicas[0].device).type.name
            out[st.first_layer:st.end_layer] = self.type_names.index(t)
        return out

    # ---- diagnosis ------------------------------------------------------------
    def best_reachable(self) -> tuple[float, str]:
        """An upper bound on any placement's throughput and the layer that sets it.

        Every layer lies in some stage; a stage is no faster than its slowest
        layer run alone with as many replicas as memory and inventory allow.
        """
        single = self.seg_index[np.arange(self.L), np.arange(1, self.L + 1)]
        best = np.where(self.fits[single], self.stage_tput[single], 0.0).max(axis=(1, 2))
        worst = int(np.argmin(best))
        return float(best[worst]), self.problem.job.model.layers[worst].name

    def describe_infeasible(self, assignment: np.ndarray | None = None) -> str:
        bound, layer = self.best_reachable()
        msg = (f"no placement meets throughput_min={self.target:.4g} samples/s: layer {layer!r} "
               f"reaches at most {bound:.4g} samples/s on any device type within the inventory")
        if assignment is not None and bound >= self.target:
            msg = f"placement infeasible ({self.evaluate_one(assignment)['bottleneck']})"
        elif bound >= self.target:  # the floor is not what rules the placements out
            msg = (f"no feasible placement found, though every layer alone reaches throughput_min="
                   f"{self.target:.4g} samples/s (the slowest, {layer!r}, at most {bound:.4g} samples/s): the devices "
                   "this scheduler may use lack the memory or the count for a whole placement")
        return msg


def replica_traffic(dense_bytes: Any, touched_bytes: Any, boundary_bytes: Any, bits: int, nic_Bps: Any,
                    latency_s: float, pipeline: bool) -> tuple[Any, Any, Any, Any]:
    """What one replica of a stage moves per iteration, and what it costs in time.

    Args (floats or broadcastable arrays): the stage's dense parameter bytes, the
    sparse rows its share touched, its boundary activation bytes (in and out,
    each direction), the job's gradient bits, the replica's NIC bandwidth.

    Returns:
        (pull, push, sync_s, wire_s): bytes pulled (fp32) and pushed (quantized);
        the PS transfer time added to an iteration without ``pipeline`` (0 with
        it: it overlaps compute); the busier NIC direction's time, PS traffic
        plus boundary traffic. A stage's period is ``max(compute + sync, wire)``.
    """
    pull = dense_bytes + touched_bytes
    push = pull if bits >= 32 else packed_bytes_array(np.asarray(pull, dtype=float), bits)
    moved = pull + push
    sync = 0.0 * moved if pipeline else moved / nic_Bps + np.where(moved > 0, 2 * latency_s, 0.0)
    wire = np.maximum(push + boundary_bytes, pull + boundary_bytes) / nic_Bps
    return pull, push, sync, wire


def even_split(total: int, n: int) -> list[int]:
    """``total`` as n integers differing by at most one, larger ones first."""
    q, r = divmod(total, n)
    return [q + 1 if i < r else q for i in range(n)]
