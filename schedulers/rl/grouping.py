"""Layer grouping: the placement problem of a long model seen as one of at most G units.

A real model has tens to hundreds of layers (resnet50: 158), most of them
small elementwise layers between the convolutions or matrix products that
carry the work. The `rl` policy places *units*: contiguous groups of layers
chosen here, so one policy step decides the type of a block of layers (as
HeterPS's layer-wise view and the device-placement work on long graphs,
Placeto and GDP, coarsen the graph before placing it). A model of at most G
layers is placed layer by layer, as before.

:class:`CoarseSpace` is the :class:`sim.placement.PlacementSpace` of the
grouped problem: its segments are the unions of consecutive groups, each
one a segment of the full space with the same provisioned replicas, price
and throughput, so a grouped placement costs exactly what its expansion to
layers costs (:meth:`CoarseSpace.expand`). Every searcher that reads a
PlacementSpace (greedy, genetic, the exact solver, the policy's episodes)
runs on it unchanged.

:func:`group_bounds` chooses the groups. A cut between two layers sends the
activation there over the NIC, so cuts go where activations are small
relative to the model's, and groups hold similar amounts of work. Concretely
it solves, by dynamic programming over the layer boundaries, for the G - 1
cuts that minimise ``sum over groups (work_share - 1/G)^2 * G + w_act *
sum over cuts log-activation score``: balanced work, cheap boundaries.
Boundaries right after a layer with no FLOPs that only rewrites its input
(an elementwise layer whose output is as large as its input) are as good as
the one before it and are not preferred over it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.placement import PlacementSpace
from sim.plan import Plan

#: Units of the grouped problem: models with more layers are placed in this many groups.
MAX_GROUPS = 24
#: Weight of a cut's activation score against the groups' work balance.
ACT_WEIGHT = 0.5


def group_bounds(space: PlacementSpace, groups: int = MAX_GROUPS) -> np.ndarray:
    """Boundaries ``0 = b_0 < b_1 < ... < b_G = L`` of at most ``groups`` contiguous layer groups.

    With ``L <= groups`` every layer is its own group. Otherwise the cuts
    minimise the work-balance plus activation score of the module docstring
    (a DP over boundaries, O(L^2 G)).
    """
    L = space.L
    if L <= groups:
        return np.arange(L + 1)
    layers = space.problem.job.model.layers
    # work of a layer: its compute time on the median type at the largest batch share,
    # plus its parameter traffic, as seconds (types differ by constant factors only roughly)
    single = space.seg_index[np.arange(L), np.arange(1, L + 1)]
    busy = space.stage_busy[single][:, :, 0]                    # (L, K) seconds, one replica
    work = np.median(busy, axis=1) + 1e-12
    share = work / work.sum()
    cshare = np.concatenate([[0.0], np.cumsum(share)])
    act = np.array([ly.activation_bytes for ly in layers], dtype=float)
    # score of a cut after layer i (0..L-2): its activation against the model's largest, in [0, 1]
    la = np.log10(1.0 + act[:-1])
    lo, hi = float(np.log10(1.0 + act.min())), float(np.log10(1.0 + act.max()))
    score = (la - lo) / (hi - lo) if hi > lo else np.zeros(L - 1)
    cut_cost = np.concatenate([[0.0], ACT_WEIGHT * score, [0.0]])   # by boundary index 0..L
    G = groups
    target = 1.0 / G
    # dp[g, i]: least cost of splitting layers [0, i) into g groups, the last ending at i
    dp = np.full((G + 1, L + 1), np.inf)
    arg = np.zeros((G + 1, L + 1), dtype=int)
    dp[0, 0] = 0.0
    idx = np.arange(L + 1)
    for g in range(1, G + 1):
        for i in range(g, L - (G - g) + 1):
            js = idx[g - 1:i]
            c = dp[g - 1, js] + G * (cshare[i] - cshare[js] - target) ** 2
            j = int(np.argmin(c))
            dp[g, i] = c[j] + cut_cost[i]
            arg[g, i] = js[j]
    bounds = [L]
    i = L
    for g in range(G, 0, -1):
        i = int(arg[g, i])
        bounds.append(i)
    return np.array(bounds[::-1])


class CoarseSpace(PlacementSpace):
    """The PlacementSpace of ``space``'s problem with layers grouped at ``bounds``.

    Units are the groups ``[bounds[g], bounds[g + 1])``; ``L`` is their number.
    Assignments are per group; :meth:`expand` gives the per-layer assignment,
    which ``space`` scores the same. Plans are built by ``space`` from the
    expansion.
    """

    def __init__(self, space: PlacementSpace, bounds: np.ndarray) -> None:  # noqa: D107 (no super().__init__: a view)
        b = np.asarray(bounds, dtype=int)
        if b[0] != 0 or b[-1] != space.L or np.any(np.diff(b) <= 0):
            raise ValueError("bounds: strictly increasing from 0 to the model's layers")
        self.__dict__.update({k: v for k, v in space.__dict__.items()})
        self.full = space
        self.bounds = b
        self.sizes = np.diff(b)
        self.L = G = b.size - 1
        jj, ii = np.triu_indices(G + 1, k=1)
        rows = space.seg_index[b[jj], b[ii]]
        self.rows = rows
        self.seg_j, self.seg_i = jj, ii
        self.S = jj.size
        self.seg_index = np.full((G + 1, G + 1), -1, dtype=int)
        self.seg_index[jj, ii] = np.arange(self.S)
        self.stage_tput = space.stage_tput[rows]
        self.stage_busy = space.stage_busy[rows]
        self.ps_load = space.ps_load[rows]
        self.fits = space.fits[rows]
        self.provision(space.target)

    def synced(self) -> PlacementSpace:
        """The full space, provisioned at this one's target (:meth:`provision` here leaves it
        alone, so that searching over targets on the groups stays cheap)."""
        if self.full.target != self.target:
            self.full.provision(self.target)
        return self.full

    def expand(self, assignments: np.ndarray) -> np.ndarray:
        """Per-layer assignments of per-group ones (the last axis repeated by group size)."""
        return np.repeat(np.asarray(assignments, dtype=int), self.sizes, axis=-1)

    def to_plan(self, assignment: np.ndarray, scheduler: str) -> Plan:
        return self.synced().to_plan(self.expand(assignment), scheduler)

    def assignment_of(self, plan: Plan) -> np.ndarray:
        return self.full.assignment_of(plan)[self.bounds[:-1]]

    def best_reachable(self) -> tuple[float, str]:
        """An upper bound on a grouped placement's throughput (every group as a stage of its
        own at best) and the first layer of the group that sets it."""
        single = self.seg_index[np.arange(self.L), np.arange(1, self.L + 1)]
        best = np.where(self.fits[single], self.stage_tput[single], 0.0).max(axis=(1, 2))
        worst = int(np.argmin(best))
        return float(best[worst]), self.problem.job.model.layers[int(self.bounds[worst])].name

    def describe_infeasible(self, assignment: np.ndarray | None = None) -> str:
        return self.synced().describe_infeasible(None if assignment is None else self.expand(assignment))

    def evaluate_one(self, assignment: np.ndarray) -> dict[str, Any]:
        return self.synced().evaluate_one(self.expand(assignment))


def grouped(space: PlacementSpace, groups: int = MAX_GROUPS) -> PlacementSpace:
    """``space`` itself when it has at most ``groups`` layers, else its :class:`CoarseSpace`."""
    if space.L <= groups:
        return space
    return CoarseSpace(space, group_bounds(space, groups))
