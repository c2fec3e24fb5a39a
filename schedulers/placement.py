"""Layer-placement schedulers (Problem B, HeterPS): cpu_only, gpu_only, greedy, genetic, bruteforce.

Each searches per-layer device-type assignments scored by
:class:`sim.placement.PlacementSpace` (stages provisioned with the fewest
replicas that meet ``objective.throughput_min``) and returns the best as a
multi-stage Plan. The objective is ``objective.minimize``: cost (default for
placement), energy, or time (the highest throughput). The exact solver is in
schedulers/exact.py, the RL policy in schedulers/rl/.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from schedulers.base import register
from sim.placement import Evaluation, PlacementInfeasible, PlacementSpace
from sim.plan import Plan
from sim.problem import Problem

#: Largest K ** L bruteforce will enumerate.
BRUTEFORCE_LIMIT = 2_000_000


def score(ev: Evaluation, minimize: str) -> np.ndarray:
    """Lower is better; infeasible placements score inf."""
    if minimize == "energy":
        s = ev.energy_j
    elif minimize == "time":
        s = np.where(ev.feasible, -ev.throughput_sps, np.inf)
    else:
        s = ev.cost_usd
    return np.where(ev.feasible, s, np.inf)


class PlacementScheduler:
    """Shared driver: build the space, search, turn the best assignment into a Plan."""

    name: ClassVar[str] = ""

    def plan(self, problem: Problem) -> Plan:
        space = PlacementSpace(problem)
        minimize = problem.objective.minimize
        a = self.search(space, minimize)
        if a is None or not space.evaluate(a[None, :]).feasible[0]:
            raise PlacementInfeasible(f"{self.name}: " + space.describe_infeasible(a))
        return space.to_plan(a, self.name)

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        raise NotImplementedError


def single_type(space: PlacementSpace, minimize: str, kinds: set[str] | None = None) -> np.ndarray | None:
    """The best plan that runs every layer on one type (of ``kinds``); None if none is feasible."""
    ks = [k for k in range(space.K) if kinds is None or space.kinds[k] in kinds]
    if not ks:
        return None
    A = np.repeat(np.array(ks)[:, None], space.L, axis=1)
    s = score(space.evaluate(A), minimize)
    best = int(np.argmin(s))
    return A[best] if np.isfinite(s[best]) else None


@register("cpu_only")
class CpuOnly(PlacementScheduler):
    """Every layer on the best CPU type."""

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        return single_type(space, minimize, {"cpu"})


@register("gpu_only")
class GpuOnly(PlacementScheduler):
    """Every layer on the best single GPU type."""

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        return single_type(space, minimize, {"gpu", "accel"})


def merge_moves(a: np.ndarray, space: PlacementSpace) -> np.ndarray:
    """Every assignment that recolours one stage with its left or right neighbour's type."""
    out = []
    for idx, (j, i, _) in enumerate(stages := space.stages_of(a)):
        for nb in (idx - 1, idx + 1):
            if 0 <= nb < len(stages):
                b = a.copy()
                b[j:i] = stages[nb][2]
                out.append(b)
    return np.array(out, dtype=int).reshape(-1, space.L)


def descent(space: PlacementSpace, a: np.ndarray, minimize: str,
            neighbours: Callable[[np.ndarray, PlacementSpace], np.ndarray]) -> np.ndarray:
    """Take the best of ``neighbours(a, space)`` while it improves the score."""
    cur = score(space.evaluate(a[None, :]), minimize)[0]
    while True:
        moves = neighbours(a, space)
        if moves.size == 0:
            return a
        s = score(space.evaluate(moves), minimize)
        best = int(np.argmin(s))
        if not s[best] < cur:
            return a
        a, cur = moves[best], s[best]


def merge_descent(space: PlacementSpace, a: np.ndarray, minimize: str) -> np.ndarray:
    """Recolour a stage with a neighbour's type while the best such move improves the score."""
    return descent(space, a, minimize, merge_moves)


def merge_repair(space: PlacementSpace, a: np.ndarray, minimize: str) -> np.ndarray | None:
    """While ``a`` is infeasible, take the best merge of a stage into a neighbour (feasible
    first, then the objective, then throughput); None if it runs out of stages first."""
    cur = score(space.evaluate(a[None, :]), minimize)[0]
    while not np.isfinite(cur):
        moves = merge_moves(a, space)
        if moves.size == 0:
            return None
        ev = space.evaluate(moves)
        s = score(ev, minimize)
        best = int(np.lexsort((-ev.throughput_sps, s))[0])
        a, cur = moves[best], s[best]
    return a


def shift_moves(a: np.ndarray, space: PlacementSpace) -> np.ndarray:
    """Every assignment that moves one boundary between two stages to another layer of
    theirs (to either end too, which removes one of the two stages)."""
    out = []
    stages = space.stages_of(a)
    for (j, m, k1), (_, i, k2) in zip(stages, stages[1:]):
        p = np.array([q for q in range(j, i + 1) if q != m])
        b = np.repeat(a[None, :], p.size, axis=0)
        pos = np.arange(j, i)[None, :]
        b[:, j:i] = np.where(pos < p[:, None], k1, k2)
        out.append(b)
    return np.concatenate(out) if out else np.zeros((0, space.L), dtype=int)


def shift_descent(space: PlacementSpace, a: np.ndarray, minimize: str) -> np.ndarray:
    """Move a stage boundary (:func:`shift_moves`) while the best such move improves the score."""
    return descent(space, a, minimize, shift_moves)


@register("greedy")
class Greedy(PlacementScheduler):
    """Each layer on the type with the lowest cost per sample for it, then merge and repair.

    Per layer, the cost per sample of running it alone as a provisioned stage
    is ``rate / throughput``; runs of one type form stages. Repair: while the
    placement is infeasible, recolour the stage whose merge into a neighbour
    gives the best placement (feasible first, then the objective, then
    throughput). Then keep merging while that improves the objective. If
    repair runs out of stages, the best single-type plan is returned.
    """

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        single = space.seg_index[np.arange(space.L), np.arange(1, space.L + 1)]
        with np.errstate(divide="ignore", invalid="ignore"):
            per_sample = np.where(space.n[single] > 0, space.rate[single] / space.tput[single], np.inf)
        if minimize == "time":
            per_sample = np.where(space.n[single] > 0, -space.tput[single], np.inf)
        a = merge_repair(space, np.argmin(per_sample, axis=1), minimize)
        if a is None:
            return single_type(space, minimize)
        return merge_descent(space, a, minimize)


@register("genetic")
class Genetic(PlacementScheduler):
    """A seeded genetic algorithm over per-layer type assignments.

    Population seeded with every single-type plan and the greedy plan, the
    rest random blocks. Tournament selection (size 3), two-point crossover,
    block mutation (a random layer range set to a random type), elitism (the
    best ``elite`` carried over). Infeasible placements rank after every
    feasible one, ordered by throughput.
    """

    def __init__(self, population: int = 64, generations: int = 150, mutation: float = 0.3,
                 elite: int = 4, seed: int | None = None) -> None:
        if population < 4 or generations < 1 or not 0 <= mutation <= 1 or not 0 <= elite < population:
            raise ValueError("population >= 4, generations >= 1, 0 <= mutation <= 1, 0 <= elite < population")
        self.population, self.generations, self.mutation, self.elite = population, generations, mutation, elite
        self.seed = seed

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        rng = np.random.default_rng(self.seed if self.seed is not None else space.problem.seed)
        L, K, P = space.L, space.K, self.population
        pop = rng.integers(0, K, (P, L))
        for r in range(P):  # random blocks: a few stages each
            cuts = np.sort(rng.choice(np.arange(1, L), size=min(L - 1, int(rng.integers(0, 4))),
                                      replace=False)) if L > 1 else np.array([], dtype=int)
            for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [L]])):
                pop[r, lo:hi] = rng.integers(0, K)
        pop[:K] = np.arange(K)[:, None]
        g = Greedy().search(space, minimize)
        if g is not None and K < P:
            pop[K] = g

        def rank_key(ev: Evaluation) -> np.ndarray:
            s = score(ev, minimize)
            return np.where(np.isfinite(s), s, 1e300 - ev.throughput_sps)

        fit = rank_key(space.evaluate(pop))
        for _ in range(self.generations):
            order = np.argsort(fit, kind="stable")
            elite = pop[order[: self.elite]]
            t = rng.integers(0, P, (2 * (P - self.elite), 3))
            parents = pop[t[np.arange(t.shape[0]), np.argmin(fit[t], axis=1)]]
            pa, pb = parents[0::2], parents[1::2]
            cut = np.sort(rng.integers(0, L + 1, (pa.shape[0], 2)), axis=1)
            pos = np.arange(L)[None, :]
            inside = (pos >= cut[:, :1]) & (pos < cut[:, 1:])
            kids = np.where(inside, pb, pa)
            mut = rng.random(kids.shape[0]) < self.mutation
            mcut = np.sort(rng.integers(0, L + 1, (kids.shape[0], 2)), axis=1)
            block = (pos >= mcut[:, :1]) & (pos < np.maximum(mcut[:, 1:], mcut[:, :1] + 1))
            newk = rng.integers(0, K, kids.shape[0])[:, None]
            kids = np.where(mut[:, None] & block, newk, kids)
            pop = np.concatenate([elite, kids])
            fit = rank_key(space.evaluate(pop))
        best = int(np.argmin(fit))
        return pop[best]


@register("bruteforce")
class Bruteforce(PlacementScheduler):
    """Every one of the K ** L assignments (tiny instances only: the ground truth for tests).

    Ties go to the first assignment in lexicographic order of type indices.
    """

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        total = space.K ** space.L
        if total > BRUTEFORCE_LIMIT:
            raise PlacementInfeasible(
                f"bruteforce: {space.K} types ** {space.L} layers = {total} placements "
                f"(limit {BRUTEFORCE_LIMIT}); use exact")
        best_s, best_a = np.inf, None
        it = itertools.product(range(space.K), repeat=space.L)
        while True:
            chunk = np.array(list(itertools.islice(it, 65536)), dtype=int)
            if chunk.size == 0:
                break
            s = score(space.evaluate(chunk.reshape(-1, space.L)), minimize)
            i = int(np.argmin(s))
            if s[i] < best_s:
                best_s, best_a = s[i], chunk[i]
        return best_a
