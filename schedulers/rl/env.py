"""`hetsim/Placement-v0`: layer placement (Problem B) as a gymnasium environment.

The HeterPS method assigns each layer of a model a device type with a policy
trained by reinforcement learning. :class:`Episode` holds the state of one
placement in progress and builds its observation and action mask from a
:class:`sim.placement.PlacementSpace`; :class:`PlacementEnv` wraps it as a
``gymnasium.Env`` (the plumbing shared with the DAG environment:
schedulers/rl/masked_env.py). The scheduler (schedulers/rl/scheduler.py)
drives Episodes directly, several at once, without the gymnasium wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hardware_profiles.errors import HetsimError
from schedulers.placement import Genetic, Greedy, single_type
from schedulers.rl.grouping import MAX_GROUPS, CoarseSpace, grouped
from schedulers.rl.masked_env import MaskedSlotEnv, log_ratio, observation_vector, padded_mask
from sim.instances import random_problem
from sim.placement import PlacementSpace
from sim.problem import Problem
from sim.workload import Layer

#: Device-type slots of the observation and the action space; instances with more types are refused.
MAX_TYPES = 8
#: Reward of a feasible plan is ``-min(cost / reference, COST_CLIP)``; an infeasible one
#: gets ``-COST_CLIP - shortfall`` (shortfall in [0, 1]), always below every feasible plan.
COST_CLIP = 3.0

_OPS = ("gemm", "conv", "embedding", "elementwise", "attention")
_KINDS = ("cpu", "gpu", "accel")
LAYER_FEATURES = 5 + len(_OPS) + 2          # current and next unit
SUMMARY_FEATURES = 7                        # units after the current one
GLOBAL_FEATURES = 12
TYPE_FEATURES = 27


def slot_layout(max_types: int = MAX_TYPES) -> tuple[int, int, int]:
    """(context features, offset of the first slot, features per slot): the context, then
    the previous layer's type one-hot (``max_types + 1``), then the type slots."""
    ctx = GLOBAL_FEATURES + 2 * LAYER_FEATURES + SUMMARY_FEATURES
    return ctx, ctx + max_types + 1, TYPE_FEATURES


def obs_size(max_types: int = MAX_TYPES) -> int:
    """Length of the observation vector."""
    return MaskedSlotEnv.obs_length(slot_layout(max_types), max_types)


def _lg(x: np.ndarray | float, scale: float, shift: float = 0.0) -> np.ndarray:
    """``(log10(1 + x) - shift) / scale``: sizes over many decades in about [-1, 1]."""
    return (np.log10(1.0 + np.asarray(x, dtype=float)) - shift) / scale


@dataclass
class Reference:
    """The plan a placement's cost is measured against (reward scale).

    ``cost_usd`` is the cheapest of the best single-type plan and greedy's
    (a small genetic search where neither is feasible); ``rate_usd_h`` is that
    plan's price per hour. Both are inf when no plan was found.
    """

    cost_usd: float
    rate_usd_h: float
    assignment: np.ndarray | None
    searched: bool = False          # found by the genetic search

    @classmethod
    def of(cls, space: PlacementSpace, search: bool = True) -> Reference:
        """The reference of ``space``; ``search=False`` skips the genetic search."""
        cands = [a for a in (single_type(space, "cost"), Greedy().search(space, "cost")) if a is not None]
        if cands:
            ev = space.evaluate(np.array(cands))
            if not ev.feasible.any():
                cands = []
        if not cands and search:
            g = Genetic(population=16, generations=10, seed=0).search(space, "cost")
            if g is not None and space.evaluate(g[None, :]).feasible[0]:
                ev = space.evaluate(g[None, :])
                return cls(float(ev.cost_usd[0]), float(ev.rate_usd_h[0]), g, searched=True)
        if not cands:
            return cls(np.inf, np.inf, None)
        ev = space.evaluate(np.array(cands))
        best = int(np.argmin(ev.cost_usd))
        return cls(float(ev.cost_usd[best]), float(ev.rate_usd_h[best]), np.array(cands[best]))


def unit_features(layers: Sequence[Layer], bounds: np.ndarray) -> np.ndarray:
    """Per unit (the layer group ``[bounds[u], bounds[u + 1])``), plus a zero row after the last:
    FLOPs forward and backward, parameter bytes, the activation bytes leaving it (its last
    layer's), sparse bytes touched per sample (sums over its layers, log-scaled), its op mix
    (each op's share of its layers, FLOPs-weighted), whether it holds a sparse layer, and its
    size in layers (log-scaled). A single layer's op mix is its op's one-hot."""
    G = bounds.size - 1
    feats = np.zeros((G + 1, LAYER_FEATURES))
    for u in range(G):
        grp = layers[bounds[u]:bounds[u + 1]]
        fl = sum(ly.fwd_flops for ly in grp)
        bw = sum(ly.bwd_flops for ly in grp)
        pb = sum(ly.param_bytes for ly in grp)
        sparse_b = sum(ly.sparse.rows_per_sample * ly.sparse.row_bytes for ly in grp if ly.sparse)
        feats[u, :5] = [_lg(fl, 5, 5), _lg(bw, 5, 5), _lg(pb, 5, 5), _lg(grp[-1].activation_bytes, 3, 3),
                        _lg(sparse_b, 3, 0)]
        w = np.array([ly.fwd_flops + ly.bwd_flops + 1.0 for ly in grp])
        for ly, wt in zip(grp, w / w.sum()):
            feats[u, 5 + _OPS.index(ly.op)] += wt
        feats[u, 5 + len(_OPS)] = 1.0 if any(ly.sparse for ly in grp) else 0.0
        feats[u, -1] = _lg(len(grp) - 1, 1.5)
    return feats


class Instance:
    """The per-problem facts an Episode reads: the grouped space, the reference and static features.

    ``full`` is the problem's PlacementSpace (``space`` when given); ``space``
    the one episodes act on: ``full`` grouped into at most ``groups`` units
    (:func:`schedulers.rl.grouping.grouped`; ``full`` itself for a model of at
    most ``groups`` layers). An episode's assignment is per unit;
    :meth:`expand` gives the per-layer one.
    """

    def __init__(self, problem: Problem, max_types: int = MAX_TYPES, space: PlacementSpace | None = None,
                 search: bool = True, groups: int = MAX_GROUPS) -> None:
        self.problem = problem
        self.full = space if space is not None else PlacementSpace(problem)
        self.space = sp = grouped(self.full, groups)
        if sp.K > max_types:
            raise HetsimError(f"rl: the cluster has {sp.K} device types; the policy handles at most "
                              f"{max_types} (train one with a larger max_types)")
        self.max_types = max_types
        self.groups = groups
        self.bounds = sp.bounds if isinstance(sp, CoarseSpace) else np.arange(sp.L + 1)
        self.ref = Reference.of(sp, search)
        L, K = sp.L, sp.K
        # rates are normalised by the price per hour of the reference plan (found without
        # the genetic search, which inference skips; with none, the cheapest whole-model
        # stage or the dearest type); throughputs by the target
        rr = self.ref.rate_usd_h if self.ref.assignment is not None and not self.ref.searched else np.inf
        if not np.isfinite(rr):
            whole = sp.rate[sp.seg_index[0, L]]
            rr = float(whole[np.isfinite(whole)].min()) if np.isfinite(whole).any() else float(sp.price.max())
        self.rate_ref = max(rr, 1e-9)
        self.tgt = max(sp.throughput_min, 1e-9)
        job = problem.job
        self.single = sp.seg_index[np.arange(L), np.arange(1, L + 1)]
        self.rest = sp.seg_index[np.arange(L), np.full(L, L)]
        # each unit alone: price per hour per type; suffix sums over the units after i
        alone = sp.rate[self.single]                               # (L, K), inf where none
        fin = np.where(np.isfinite(alone), alone, np.nan)
        best = np.nan_to_num(np.nanmin(np.where(np.isfinite(fin).any(axis=1, keepdims=True), fin, 0.0), axis=1))
        self.alone = alone
        self.after_best = np.concatenate([np.cumsum(best[::-1])[::-1][1:], [0.0, 0.0]])   # (L+1,)
        after_k = np.cumsum(alone[::-1], axis=0)[::-1]
        self.after_k = np.concatenate([after_k[1:], np.zeros((2, K))])                     # (L+1, K)
        layers = job.model.layers
        self.layer_feats = unit_features(layers, self.bounds)   # row L: zeros (no next unit)
        b = self.bounds
        fl = np.array([sum(ly.fwd_flops + ly.bwd_flops for ly in layers[b[u]:b[u + 1]]) for u in range(L)])
        pb = np.array([sum(ly.param_bytes for ly in layers[b[u]:b[u + 1]]) for u in range(L)])
        ab = np.array([layers[b[u + 1] - 1].activation_bytes for u in range(L)])
        sp_ = np.array([1.0 if any(ly.sparse for ly in layers[b[u]:b[u + 1]]) else 0.0 for u in range(L)])
        summ = np.zeros((L + 1, SUMMARY_FEATURES))
        for i in range(L):                        # units i+1 .. L-1
            r = slice(i + 1, L)
            n = L - i - 1
            if n:
                summ[i] = [n / 24, _lg(fl[r].sum(), 5, 5), _lg(fl[r].max(), 5, 5), _lg(pb[r].sum(), 5, 5),
                           _lg(ab[r].max(), 3, 3), _lg(ab[r].mean(), 3, 3), sp_[r].mean()]
        self.summary = summ
        types = problem.cluster.types
        stat = np.zeros((K, 9))
        for k, name in enumerate(sp.type_names):
            d = types[name]
            stat[k, 0] = 1.0
            stat[k, 1 + _KINDS.index(d.kind)] = 1.0
            stat[k, 4] = np.log(d.price_per_hour + 1e-3) / 3
            stat[k, 5] = _lg(d.peak(job.dtype), 2, 12)
            stat[k, 6] = _lg(d.mem_bw_Bps, 2, 10)
            stat[k, 7] = _lg(d.memory_bytes, 2, 9)
            stat[k, 8] = np.log2(sp.counts[k]) / 5
        self.type_static = stat
        self.glob = np.array([L / 24, 1.0 if job.pipeline else 0.0, np.log2(job.global_batch) / 12,
                              sp.ps_rate / self.rate_ref, _lg(len(layers) - 1, 1.5)])

    @property
    def slots(self) -> int:
        """Type slots of the policy this instance is built for."""
        return self.max_types

    def expand(self, assignments: np.ndarray) -> np.ndarray:
        """Per-layer assignments of per-unit ones (the last axis)."""
        return np.repeat(np.asarray(assignments, dtype=int), np.diff(self.bounds), axis=-1)


class Episode:
    """One placement in progress: layers ``0 .. i-1`` have types, layer ``i`` is next.

    The layers since the last change of type form the open stage ``[start, i)``;
    earlier stages are closed, with their provisioned replicas counted against
    the inventory.
    """

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        sp = inst.space
        self.assignment = np.full(sp.L, -1, dtype=int)
        self.i = 0
        self.start = 0
        self.prev = -1
        self.used = np.zeros(sp.K, dtype=int)     # replicas of closed stages per type
        self.closed_rate = 0.0
        self.closed_tput = np.inf
        self.stages = 0
        self._opts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # this step's

    @property
    def done(self) -> bool:
        return self.i >= self.inst.space.L

    def _options(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per type: replicas, rate and throughput of layer i's stage if it takes that type,
        and whether the inventory left allows it (computed once per step: the mask, the
        env's validity check and the observation all read it)."""
        if self._opts is None:
            self._opts = self._compute_options()
        return self._opts

    def _compute_options(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        sp, i = self.inst.space, self.i
        seg = np.full(sp.K, self.inst.single[i])
        if self.prev >= 0:
            seg[self.prev] = sp.seg_index[self.start, i + 1]
        k = np.arange(sp.K)
        n, rate, tput = sp.n[seg, k], sp.rate[seg, k], sp.tput[seg, k]
        # valid: some stage holding layer i (from the open stage's start for its type, from i
        # for the others) and ending at any later boundary fits within the inventory left. The
        # shortest such stage is not enough: a stage may only be provisionable once it also
        # holds the next layers (a large activation at its end no longer crosses a NIC).
        ends = np.arange(i + 1, sp.L + 1)
        n_end = sp.n[sp.seg_index[i, ends]]                         # (ends, K), a copy
        if self.prev >= 0:
            n_end[:, self.prev] = sp.n[sp.seg_index[self.start, ends], self.prev]
        ok = ((n_end > 0) & (self.used[None, :] + n_end <= sp.counts[None, :])).any(axis=0)
        return n, rate, tput, ok

    def action_mask(self) -> np.ndarray:
        """Types for which some stage holding layer i can be provisioned within the inventory left.

        Padding slots are never valid. If no real type is, every real type is
        (the episode then ends infeasible and is penalised).
        """
        ok = self._options()[3]
        return padded_mask(ok if ok.any() else np.ones_like(ok), self.inst.max_types)

    def observation(self) -> np.ndarray:
        inst, sp = self.inst, self.inst.space
        i, K, L = min(self.i, sp.L - 1), sp.K, sp.L
        n, rate, tput, ok = self._options()
        rr, tg = inst.rate_ref, inst.tgt
        cur_rate = cur_tput = 0.0
        if self.prev >= 0:
            s = sp.seg_index[self.start, self.i]
            cur_rate, cur_tput = float(sp.rate[s, self.prev]), float(sp.tput[s, self.prev])
        glob = np.concatenate([inst.glob, [min(inst.after_best[i] / rr, 10.0),
            self.i / L, (L - self.i) / L, self.stages / 8, self.closed_rate / rr,
            min(cur_rate / rr, 10.0), float(log_ratio(min(self.closed_tput, cur_tput or np.inf), tg))]])
        prev = np.zeros(inst.max_types + 1)
        prev[self.prev if self.prev >= 0 else inst.max_types] = 1.0
        # per type: static facts, the stage layer i would join, the rest of the model as one stage
        rest_seg = inst.rest[i]
        kk = np.arange(K)
        rest_rate = sp.rate[rest_seg].copy()
        rest_tput = sp.tput[rest_seg].copy()
        if self.prev >= 0:               # the open stage extended to the end
            s = sp.seg_index[self.start, L]
            rest_rate[self.prev], rest_tput[self.prev] = sp.rate[s, self.prev], sp.tput[s, self.prev]
        single_rate = sp.rate[inst.single[i], kk]
        with np.errstate(invalid="ignore"):
            delta = np.where(kk == self.prev, rate - cur_rate, rate)
        share = np.array([(self.assignment[: self.i] == k).mean() if self.i else 0.0 for k in kk])
        per = np.zeros((inst.max_types, TYPE_FEATURES))
        per[:K, :9] = inst.type_static
        per[:K, 9] = (sp.counts - self.used) / sp.counts
        per[:K, 10] = ok
        per[:K, 11] = kk == self.prev
        per[:K, 12] = np.minimum(n / sp.counts, 1.0)
        per[:K, 13] = log_ratio(rate, rr)
        per[:K, 14] = np.clip(np.where(delta == delta, delta / rr, 5.0), -5, 5)
        per[:K, 15] = log_ratio(tput, tg)
        per[:K, 16] = log_ratio(single_rate, rr)
        per[:K, 17] = sp.n[inst.single[i], kk] > 0
        per[:K, 18] = log_ratio(rest_rate, rr)
        per[:K, 19] = log_ratio(rest_tput, tg)
        per[:K, 20] = np.isfinite(rest_rate)
        per[:K, 21] = share
        fin = np.isfinite(single_rate)
        per[:K, 22] = log_ratio(single_rate, float(single_rate[fin].min())) if fin.any() else 5.0
        per[:K, 23] = self.used / sp.counts
        nxt = inst.alone[i + 1] if i + 1 < L else np.zeros(K)
        per[:K, 24] = log_ratio(nxt, rr) if i + 1 < L else 0.0
        per[:K, 25] = np.isfinite(nxt)
        per[:K, 26] = log_ratio(inst.after_k[i], rr) if i + 1 < L else 0.0
        return observation_vector([glob, inst.layer_feats[i], inst.layer_feats[i + 1], inst.summary[i], prev,
                                   per.ravel()])

    def step(self, k: int) -> None:
        """Give layer i type k (the caller checks k against the mask)."""
        sp = self.inst.space
        if k != self.prev and self.prev >= 0:            # close the open stage
            s = sp.seg_index[self.start, self.i]
            self.used[self.prev] += sp.n[s, self.prev]
            self.closed_rate += float(sp.rate[s, self.prev]) if sp.n[s, self.prev] > 0 else 0.0
            self.closed_tput = min(self.closed_tput, float(sp.tput[s, self.prev]))
        if k != self.prev:
            self.stages += 1
            self.start = self.i
        self.assignment[self.i] = k
        self.prev = k
        self.i += 1
        self._opts = None

    def outcome(self) -> dict[str, Any]:
        """The finished placement's evaluation, reward and gap to the reference."""
        sp, ref = self.inst.space, self.inst.ref
        ev = sp.evaluate(self.assignment[None, :])
        feasible, cost, T = bool(ev.feasible[0]), float(ev.cost_usd[0]), float(ev.throughput_sps[0])
        if feasible:
            ratio = cost / ref.cost_usd if np.isfinite(ref.cost_usd) else 1.0
            reward = -min(ratio, COST_CLIP)
        else:
            shortfall = 1.0 - min(T / self.inst.tgt, 1.0) if self.inst.tgt > 0 else 0.0
            if ev.provisioned[0] and not ev.inventory_ok[0]:
                shortfall = max(shortfall, 0.5)
            ratio = np.inf
            reward = -COST_CLIP - shortfall
        return {"feasible": feasible, "cost_usd": cost, "throughput_sps": T, "cost_ratio": ratio,
                "reward": float(reward), "reference_cost_usd": ref.cost_usd,
                "bottleneck": ev.bottleneck[0]}


class PlacementEnv(MaskedSlotEnv[Instance, Episode]):
    """Layer placement for minimum cost under a throughput constraint (HeterPS, Problem B).

    ## Description
    An episode places one model on one cluster: at step i the agent picks the
    device type of layer i. Consecutive layers of one type form a stage; each
    stage is provisioned with the fewest replicas meeting
    ``objective.throughput_min`` (:class:`sim.placement.PlacementSpace`).
    Given ``problem`` the episode is always that problem (per-instance
    fine-tuning); otherwise each reset draws one from
    :func:`sim.instances.random_problem` with a seed from ``self.np_random``
    below ``TRAIN_SEED_LIMIT`` (instances no reference plan solves are redrawn),
    or, given ``pool`` (prebuilt :class:`Instance` objects, shared between the
    environments of a vector env), picks one of the pool.

    ## Action Space
    ``Discrete(max_types)``: the index of a device type in the cluster's type
    order. ``action_masks()`` marks the valid ones: real types (not padding)
    for which a stage holding the current layer (starting there, or the open
    stage of the same type, and ending at any later layer) can be provisioned
    in memory and within the inventory left. If none is, every real type is
    valid and the episode ends infeasible.

    ## Observation Space
    ``Box(-10, 10, (obs_size(max_types),), float32)``: globals (layers, batch,
    pipeline, progress, stages so far, closed and open stages' price per hour
    relative to the reference plan, their throughput relative to the target);
    the current and next layer's FLOPs, parameter and activation bytes, sparse
    bytes, op class and sparse flag (log-scaled); a summary of the layers after
    the current one (count, total and largest FLOPs, parameter bytes,
    activation bytes, sparse share); the previous layer's type (one-hot); and
    per type slot: kind, price, peak FLOP/s, memory bandwidth and size,
    inventory and what is left of it, the mask, and the cost model's
    provisioned replicas, price per hour and throughput of the stage the
    current layer would join, of the layer alone, and of the rest of the model
    as one stage on that type. Padding slots are zero.

    ## Rewards
    0 until the last layer; then ``-min(cost / reference_cost, 3)`` for a
    feasible plan (reference: the cheaper of the best single-type plan and
    greedy's) and ``-3 - shortfall`` for an infeasible one, shortfall in [0, 1]
    (throughput missing, at least 0.5 for an inventory overrun).

    ## Episode End
    Terminates after the last layer; never truncates. ``info`` of the last
    step holds the plan's ``cost_usd``, ``feasible``, ``cost_ratio`` and
    ``assignment``.
    """

    instance_kind = "Instance"
    slots_param = "max_types"

    def __init__(self, problem: Problem | None = None, max_types: int = MAX_TYPES,
                 instance_kwargs: dict[str, Any] | None = None,
                 pool: Sequence[Instance] | None = None) -> None:
        self.max_types = max_types
        self.instance_kwargs = dict(instance_kwargs or {})
        fixed = Instance(problem, max_types) if problem is not None else None
        super().__init__(max_types, slot_layout(max_types), fixed, pool)

    def draw_instance(self) -> Instance:
        """A random problem a reference plan solves (50 draws at most)."""
        for _ in range(50):
            seed = self.training_seed()
            inst = Instance(random_problem(seed, **self.instance_kwargs), self.max_types)
            if np.isfinite(inst.ref.cost_usd):
                return inst
        return inst

    def new_episode(self, inst: Instance) -> Episode:
        return Episode(inst)

    def reset_info(self, inst: Instance) -> dict[str, Any]:
        return {"problem": inst.problem.name, "layers": inst.space.L, "types": inst.space.K}

    def final_info(self, ep: Episode) -> dict[str, Any]:
        return {"assignment": ep.inst.expand(ep.assignment)}
