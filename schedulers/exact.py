"""`exact`: the proven cost optimum of a placement (Problem B), or a bound and its gap.

The cost of a placement is ``(R + R_ps) * samples / T / 3600`` where R is the
provisioned devices' price per hour and T the plan's throughput, the minimum
of its stages' throughputs ``T_s`` and the PS bound ``T_ps = ps_capacity /
P`` (P: the stages' PS bytes per sample, summed). Provisioning fixes each
stage's (segment, type) replicas, so every stage option has a fixed rate,
throughput and PS load (:class:`sim.placement.PlacementSpace`). The ratio
makes the cost non-separable, and the PS couples every stage; the cost is
minimised by a branch and bound over T itself:

* ``R(V)``, the least rate of a placement whose stages all have ``T_s >= V``
  under the inventory, is a dynamic programme over layer boundaries with the
  last stage's type as state (consecutive stages differ in type), O(L^2 K).
  When its placement uses more devices of a type than the inventory holds, the
  violated types' usage joins the DP state (a resource-constrained shortest
  path, exact; :func:`rc_dp_min_rate`) until no type is violated. Only past
  ``RC_DP_MAX_STATES`` states does a Lagrangian bound plus a time-capped MILP
  (scipy.optimize.milp, HiGHS) over stage options x[segment, type] with flow,
  no-repeated-type and inventory rows take over.
* ``Q(t)``, the least rate with every ``T_s >= t``, ``T_ps >= t`` and the
  inventory, is at least ``R(t)``, and equal when R's placement meets the PS.
  Otherwise the same DP takes the PS load as one more resource, discretised
  into ``PS_UNITS`` units of ``ps_capacity / t`` (loads rounded down: a lower
  bound; rounded up: a feasible placement).
* A node is an interval [ta, tb] of T. Every placement in it costs at least
  ``hours * max((Q + R_ps) / T_hi, S + R_ps / T_hi)`` with ``T_hi = min(tb,
  ps_capacity / P_min)``, P_min the least PS load and S the least sum of
  per-stage ``rate_s / T_s`` with every stage >= ta (T never exceeds any
  T_s). The least-rate placement p with T >= ta closes [ta, T(p)] at once: any
  placement with T there has rate >= rate(p) and T <= T(p). Below ``t_star(r)
  = (r + R_ps) * hours / best`` a rate >= r cannot beat the incumbent, so ta
  moves there; the rest is split (at the median stage throughput inside, or
  geometrically).
* When the discretised Q(ta) is attained by no placement and prunes nothing
  above ta, no split raises it at ta itself; the MILP with the exact PS row
  decides. Intervals narrower than ``PS_REL_TOL`` still open then (the MILP
  past its time cap) count their bound in the gap.

The result is proven optimal when no interval stays open (gap 0); otherwise
``gap = (best - lower_bound) / best`` says how far from proven it is. The
incumbent starts from the heuristics (single-type plans, greedy, a short
genetic run), so exact is never worse than they are.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from hardware_profiles.errors import ConfigError
from schedulers.base import register
from schedulers.placement import Genetic, Greedy, PlacementScheduler
from sim.placement import PlacementInfeasible, PlacementSpace
from sim.plan import Plan
from sim.problem import Problem

#: Wall-clock cap of one MILP call (HiGHS returns its incumbent and dual bound past it).
MILP_CALL_LIMIT_S = 5.0
#: Generations of the genetic run that seeds the incumbent.
INCUMBENT_GENERATIONS = 40
#: Units the PS bound is discretised into (per threshold) in the DP.
PS_UNITS = 256
#: Relative width below which an interval of T the PS holds back is left open (its bound counts in the gap).
PS_REL_TOL = 1e-6
#: Placements the MILP with the PS row may cut off (each one PS-infeasible within HiGHS's tolerance).
MILP_CUTS = 8
#: Largest inventory state (product of count + 1 over binding types) the resource DP takes on.
RC_DP_MAX_STATES = 50_000


@dataclass
class ExactResult:
    assignment: np.ndarray | None
    cost_usd: float
    lower_bound_usd: float
    gap: float
    thresholds: int          # distinct stage throughputs
    solves: int              # thresholds solved
    milp_solves: int
    rc_dp_solves: int        # DPs with inventory state
    seconds: float
    timed_out: bool = False

    @property
    def proven(self) -> bool:
        return self.gap <= 1e-9


def dp_min_rate(space: PlacementSpace, allowed: np.ndarray,
                rate: np.ndarray | None = None) -> tuple[float, np.ndarray | None]:
    """Least total ``rate`` (default: the provisioned price per hour) of a placement using
    only ``allowed`` (S, K) stage options.

    Consecutive stages differ in type. Returns (rate, assignment) or (inf, None).
    """
    L, K = space.L, space.K
    rate = np.where(allowed, space.rate if rate is None else rate, np.inf)
    best = np.full((L + 1, K), np.inf)
    from_j = np.zeros((L + 1, K), dtype=int)
    from_k = np.full((L + 1, K), -1, dtype=int)
    excl = np.full((L + 1, K), np.inf)      # min over the previous type k' != k at boundary j
    excl_k = np.full((L + 1, K), -1, dtype=int)
    excl[0] = 0.0
    for i in range(1, L + 1):
        js = np.arange(i)
        cand = excl[:i] + rate[space.seg_index[js, i]]            # (i, K)
        jbest = np.argmin(cand, axis=0)
        best[i] = cand[jbest, np.arange(K)]
        from_j[i] = jbest
        from_k[i] = excl_k[jbest, np.arange(K)]
        if i < L:
            order = np.argsort(best[i], kind="stable")
            k1, k2 = order[0], order[1] if K > 1 else order[0]
            excl[i] = best[i][k1]
            excl_k[i] = k1
            excl[i, k1] = best[i][k2] if K > 1 else np.inf
            excl_k[i, k1] = k2 if K > 1 else -1
    k = int(np.argmin(best[L]))
    if not np.isfinite(best[L, k]):
        return np.inf, None
    a = np.empty(L, dtype=int)
    i = L
    while i > 0:
        j = from_j[i, k]
        a[j:i] = k
        i, k = j, from_k[i, k]
    return float(best[L].min()), a


def rc_dp_min_rate(space: PlacementSpace, allowed: np.ndarray, binding: list[int],
                   extra: tuple[np.ndarray, int] | None = None) -> tuple[float, np.ndarray | None]:
    """:func:`dp_min_rate` with the inventory of the ``binding`` types as DP state.

    The state adds the devices used so far of each binding type (0..count), so
    every placement it returns fits their inventory exactly: a
    resource-constrained shortest path, O(L^2 K prod(count_b + 1)). ``extra =
    (units, budget)`` adds one more resource: ``units[s, k]`` (non-negative
    integers) of option (s, k), at most ``budget`` in all (the PS bound,
    discretised by the caller). For each (boundary i, type k) the segments
    ending at i are grouped by their replicas (the inventory shift is one
    array operation per group); within a group each segment's own shift on
    the extra axis is a strided read of a padded array, so no index arrays of
    the state's size are built. The placement is recovered by searching each
    stage's predecessor for the value it was computed from (the same float
    sum, so equality is exact), which spares an argmin per group.
    """
    dp = _InventoryDP(space, allowed, binding, extra)
    best = dp.fill()
    flat = int(np.argmin(best))
    k, v, u = (int(x) for x in np.unravel_index(flat, best.shape))
    val = float(best[k, v, u])
    if not np.isfinite(val):
        return np.inf, None
    return float(best.min()), dp.placement(k, v, u, val)


class _InventoryDP:
    """The tables of :func:`rc_dp_min_rate` and the layout of its state.

    A state is (inventory used of each binding type, flattened to ``v`` in
    ``range(inv)``; extra units used ``u`` in ``range(g)``).
    ``excl[j, k, v, pad + u]``: the least rate up to boundary j in state (v, u),
    its last stage's type not k (at j = 0: nothing placed); ``excl_k``: the
    last stage's type it comes from. The first ``pad`` entries of excl's last
    axis stay inf: a stage of d units reads its predecessors at
    ``[pad - d, pad - d + g)``, and the part below zero is unreachable.
    """

    def __init__(self, space: PlacementSpace, allowed: np.ndarray, binding: list[int],
                 extra: tuple[np.ndarray, int] | None) -> None:
        self.space = space
        L, K = space.L, space.K
        self.inv_dims = [int(space.counts[k]) + 1 for k in binding]
        self.inv = int(np.prod(self.inv_dims)) if self.inv_dims else 1
        self.g = g = int(extra[1]) + 1 if extra else 1
        self.units = units = extra[0] if extra else np.zeros(space.rate.shape, dtype=int)
        self.rate = np.where(allowed & (units < g), space.rate, np.inf)
        self.finite = np.isfinite(self.rate)
        self.pad = pad = int(units[self.finite].max(initial=0))
        self.axis = {k: a for a, k in enumerate(binding)}
        self.excl = np.full((L + 1, K, self.inv, pad + g), np.inf)
        self.excl_k = np.full((L + 1, K, self.inv, g), -1, dtype=np.int8)
        self.excl[0, :, 0, pad] = 0.0

    def after(self, k: int, n: int, v: np.ndarray) -> np.ndarray:
        """Inventory states ``v`` (inv, g) moved on by a stage of n replicas of type k."""
        if k not in self.axis:
            return v
        a, dims, g = self.axis[k], self.inv_dims, self.g
        y = np.full(dims + [g], np.inf)
        if n < dims[a]:
            src = v.reshape(dims + [g])
            y[(slice(None),) * a + (slice(n, None),)] = src[(slice(None),) * a + (slice(0, dims[a] - n),)]
        return y.reshape(self.inv, g)

    def fill(self) -> np.ndarray:
        """Fill the tables boundary by boundary; returns ``best[k, v, u]``, the least rate of
        a whole placement ending with type k in state (v, u)."""
        space, pad, g, units, rate = self.space, self.pad, self.g, self.units, self.rate
        L, K = space.L, space.K
        best = np.full((K, self.inv, g), np.inf)
        for i in range(1, L + 1):
            best.fill(np.inf)
            segs = space.seg_index[np.arange(i), i]
            for k in range(K):
                ok = self.finite[segs, k]
                if not ok.any():
                    continue
                win = np.lib.stride_tricks.sliding_window_view(self.excl[:i, k], g, axis=-1)  # (i, inv, pad + 1, g)
                ns = space.n[segs, k]
                for n in np.unique(ns[ok]):
                    js = np.flatnonzero(ok & (ns == n))
                    cand = win[js, :, pad - units[segs[js], k], :]         # (m, inv, g), a copy
                    cand += rate[segs[js], k][:, None, None]
                    np.minimum(best[k], self.after(k, int(n), cand.min(axis=0)), out=best[k])
            if i < L:
                self._exclude(i, best)
        return best

    def _exclude(self, i: int, best: np.ndarray) -> None:
        """excl[i] from ``best`` at boundary i: per state, the best over the other types,
        from the two best types."""
        K = self.space.K
        order = np.argsort(best, axis=0, kind="stable")
        k1 = order[0]
        m1 = np.take_along_axis(best, k1[None], axis=0)[0]
        k2 = order[1] if K > 1 else np.full_like(k1, -1)
        m2 = np.take_along_axis(best, k2[None], axis=0)[0] if K > 1 else np.full_like(m1, np.inf)
        for k in range(K):
            use2 = k1 == k
            self.excl[i, k, :, self.pad:] = np.where(use2, m2, m1)
            self.excl_k[i, k] = np.where(use2, k2, k1)

    def placement(self, k: int, v: int, u: int, val: float) -> np.ndarray:
        """The placement whose last stage has type k and ends in state (v, u) at rate ``val``:
        each stage's predecessor is the one whose table entry plus the stage's rate
        reproduces the value (the same float sum, so equality is exact)."""
        space, inv_dims, pad, excl = self.space, self.inv_dims, self.pad, self.excl
        a_out = np.empty(space.L, dtype=int)
        i = space.L
        while i > 0:
            for j in range(i):
                seg = space.seg_index[j, i]
                if not self.finite[seg, k]:
                    continue
                vs = list(np.unravel_index(v, inv_dims)) if inv_dims else []
                if k in self.axis:
                    vs[self.axis[k]] -= int(space.n[seg, k])
                up = u - int(self.units[seg, k])
                if up < 0 or any(x < 0 for x in vs):
                    continue
                vp = int(np.ravel_multi_index(tuple(vs), inv_dims)) if inv_dims else 0
                if excl[j, k, vp, pad + up] + self.rate[seg, k] == val:
                    break
            else:   # unreachable: the value came from one of these sums
                raise AssertionError("rc_dp_min_rate: no predecessor reproduces the DP value")
            a_out[j:i] = k
            val = float(excl[j, k, vp, pad + up])
            i, k, v, u = j, int(self.excl_k[j, k, vp, up]), vp, up
        return a_out


def resources(space: PlacementSpace, ps_threshold: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Resource use of every stage option and the capacities: one row per device type
    (replicas vs the inventory) and, given ``ps_threshold``, one for the PS
    (bytes per sample vs ``ps_capacity / ps_threshold``, i.e. T_ps >= threshold)."""
    K = space.K
    use = np.zeros((K + (ps_threshold is not None), space.S, K))
    for k in range(K):
        use[k, :, k] = space.n[:, k]
    cap = space.counts.astype(float)
    if ps_threshold is not None:
        use[K] = space.ps
        cap = np.append(cap, space.ps_capacity / ps_threshold)
    return use, cap


def lagrangian_min_rate(space: PlacementSpace, allowed: np.ndarray, ps_threshold: float | None,
                        iterations: int = 150) -> tuple[float, float, np.ndarray | None]:
    """Least rate under the inventory (and PS) rows, by Lagrangian relaxation of those rows.

    ``min sum rate + lam . (use - cap)`` over placements is a DP with
    per-option surcharges; its value is a lower bound for every lam >= 0.
    Subgradient steps (Polyak, against the best feasible rate found) move lam.
    Returns (lower bound, best feasible rate, its placement); equal bound and
    rate prove the placement optimal.
    """
    use, cap = resources(space, ps_threshold)
    lam = np.zeros(cap.size)
    lb, ub, best = -np.inf, np.inf, None
    finite = space.rate[allowed & np.isfinite(space.rate)]
    scale = float(finite.max()) if finite.size else 1.0
    norm = np.where(cap > 0, cap, 1.0)             # rows in comparable units
    for _ in range(iterations):
        surcharge = np.tensordot(lam / norm, use, axes=1)
        r, a = dp_min_rate(space, allowed, space.rate + surcharge)
        if a is None:
            return np.inf, np.inf, None
        st = [(space.seg_index[j, i], k) for j, i, k in space.stages_of(a)]
        used = np.array([sum(use[q][s, k] for s, k in st) for q in range(cap.size)])
        true_rate = float(sum(space.rate[s, k] for s, k in st))
        lb = max(lb, true_rate + float(lam / norm @ (used - cap)))
        g = (used - cap) / norm
        if (g <= 1e-12).all() and true_rate < ub:
            ub, best = true_rate, a
        if closed(lb, ub):
            break
        target = ub if np.isfinite(ub) else lb + 0.1 * scale + 1e-9
        step = max(target - lb, 1e-9 * scale) / max(float(g @ g), 1e-12)
        lam = np.maximum(0.0, lam + step * g)
    return lb, ub, best


def closed(lb: float, ub: float) -> bool:
    return bool(np.isfinite(ub) and ub - lb <= 1e-9 * max(abs(ub), 1e-12))


def milp_min_rate(space: PlacementSpace, allowed: np.ndarray, ps_threshold: float | None,
                  time_limit_s: float, exclude: Sequence[np.ndarray] = ()) -> tuple[float, np.ndarray | None]:
    """Least rate with the inventory (and, given ``ps_threshold``, PS bandwidth) enforced.

    ``exclude``: placements cut off (at most all but one of each one's stages chosen).
    Returns (a lower bound, the placement found or None): the optimum's rate when
    HiGHS proves it, its dual bound past the time limit, inf when infeasible.
    """
    s_idx, k_idx = np.nonzero(allowed)
    nv = s_idx.size
    if nv == 0:
        return np.inf, None
    L, K = space.L, space.K
    sj, si = space.seg_j[s_idx], space.seg_i[s_idx]
    rows, lo, hi = [], [], []

    def add(coef: np.ndarray, a: float, b: float) -> None:
        rows.append(coef)
        lo.append(a)
        hi.append(b)

    add((sj == 0).astype(float), 1, 1)                              # one first stage
    for p in range(1, L):                                           # a stage ends where the next starts
        add((si == p).astype(float) - (sj == p).astype(float), 0, 0)
        for k in range(K):                                          # not the same type on both sides
            m = (k_idx == k) & ((si == p) | (sj == p))
            if m.any():
                add(m.astype(float), 0, 1)
    add((si == L).astype(float), 1, 1)
    n = space.n[s_idx, k_idx].astype(float)
    for k in range(K):
        add(np.where(k_idx == k, n, 0.0), 0, float(space.counts[k]))
    if ps_threshold is not None and space.ps_capacity > 0:
        add(space.ps[s_idx, k_idx], 0, space.ps_capacity / ps_threshold)
    var = np.full(space.rate.shape, -1)
    var[s_idx, k_idx] = np.arange(nv)
    for a in exclude:
        stages = [var[space.seg_index[j, i], k] for j, i, k in space.stages_of(a)]
        add(np.isin(np.arange(nv), stages).astype(float), 0, len(stages) - 1)
    res = milp(space.rate[s_idx, k_idx], integrality=np.ones(nv), bounds=Bounds(0, 1),
               constraints=LinearConstraint(csr_array(np.array(rows)), lo, hi),
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})
    if res.status == 2:
        return np.inf, None
    # past the time limit HiGHS returns its incumbent (if any); its dual bound stays a valid bound
    bound = float(res.fun) if res.status == 0 else float(getattr(res, "mip_dual_bound", None) or -np.inf)
    if res.x is None:
        return bound, None
    out = np.empty(L, dtype=int)
    for v in np.flatnonzero(res.x > 0.5):
        out[sj[v]:si[v]] = k_idx[v]
    return bound, out


def solve(space: PlacementSpace, time_limit_s: float = 60.0) -> ExactResult:
    """Branch and bound over the plan's throughput T (module docstring)."""
    bb = _BranchAndBound(space, time_limit_s)
    bb.seed_incumbent()
    return bb.run()


class _BranchAndBound:
    """One run of :func:`solve`: the incumbent, the memos of the bounds per threshold, the
    solver counters, and the search over intervals of T.

    ``V`` holds the distinct stage throughputs (the thresholds); a threshold is
    named by its index into it. Every bound method memoises per threshold
    (``memo``: R, ``ps_memo``: Q, ``sep_memo`` and ``ps_min_memo``: the
    per-sample rate and least PS load) and offers every placement it meets to
    the incumbent (:meth:`consider`).
    """

    def __init__(self, space: PlacementSpace, time_limit_s: float) -> None:
        self.t0 = time.perf_counter()
        self.space = space
        self.time_limit_s = time_limit_s
        self.feas = space.n > 0
        self.V = np.unique(space.tput[self.feas])
        self.hours = space.samples / 3600.0
        self.memo: dict[int, tuple[float, np.ndarray | None]] = {}
        self.ps_memo: dict[tuple[float, bool], tuple[float, np.ndarray | None]] = {}
        self.sep_memo: dict[int, float] = {}
        self.ps_min_memo: dict[int, float] = {}
        self.best = np.inf                  # the incumbent's cost and placement
        self.a: np.ndarray | None = None
        self.milp = 0                       # MILP calls
        self.rc_dp = 0                      # DPs with inventory (and PS) state
        with np.errstate(divide="ignore", invalid="ignore"):
            self.per_sample = np.where(self.feas, space.rate / space.tput, np.inf)   # $/h per (sample/s)

    # ------------------------------------------------------------ incumbent
    def left_s(self) -> float:
        return self.time_limit_s - (time.perf_counter() - self.t0)

    def consider(self, a: np.ndarray | None) -> None:
        """Keep placement ``a`` if it is feasible and cheaper than the incumbent."""
        if a is None:
            return
        ev = self.space.evaluate(a[None, :])
        if ev.feasible[0] and ev.cost_usd[0] < self.best:
            self.best, self.a = float(ev.cost_usd[0]), a

    def consider_many(self, A: np.ndarray) -> None:
        """Keep the cheapest of placements ``A`` (rows) if it is feasible and beats the incumbent."""
        ev = self.space.evaluate(A)
        i = int(np.argmin(ev.cost_usd))
        if ev.feasible[i] and ev.cost_usd[i] < self.best:
            self.best, self.a = float(ev.cost_usd[i]), A[i]

    def seed_incumbent(self) -> None:
        """Incumbents from the heuristics: single-type plans, greedy and a short genetic run."""
        space = self.space
        self.consider_many(np.repeat(np.arange(space.K)[:, None], space.L, axis=1))
        self.consider(Greedy().search(space, "cost"))
        self.consider(Genetic(generations=INCUMBENT_GENERATIONS, seed=0).search(space, "cost"))

    def attains(self, a: np.ndarray | None, t: float, lb: float) -> float:
        """T(a) when placement ``a`` is feasible, has T >= t and a rate within rounding of
        the lower bound ``lb`` (so it is a least-rate placement with T >= t); else 0."""
        if a is None:
            return 0.0
        ev = self.space.evaluate(a[None, :])
        T = float(ev.throughput_sps[0])
        ok = ev.feasible[0] and T >= t * (1 - 1e-12) and \
            rate_of(self.space, a) <= lb * (1 + 1e-12)
        return T if ok else 0.0

    # -------------------------------------------------------- R: no PS row
    def allowed_at(self, idx: int) -> np.ndarray:
        return self.feas & (self.space.tput >= self.V[idx])

    def rate_at(self, idx: int) -> float:
        """A lower bound on R(V[idx]), the least rate with every T_s >= V[idx] under the
        inventory (the PS row left out); records candidate placements."""
        if idx in self.memo:
            return self.memo[idx][0]
        allowed = self.allowed_at(idx)
        r, a = dp_min_rate(self.space, allowed)
        if a is not None:
            self.consider(a)
            if violated(self.space, a):          # binding types into the DP state
                r, a = self.inventory_min_rate(allowed, a)
                self.consider(a)
        self.memo[idx] = (r, a)
        return r

    def inventory_min_rate(self, allowed: np.ndarray, a: np.ndarray) -> tuple[float, np.ndarray | None]:
        """Exact R(V) under the inventory: add violated types to the DP state until none is
        violated; past RC_DP_MAX_STATES states, a Lagrangian bound and a time-capped MILP."""
        r, a2, runs, done = inventory_dp(self.space, allowed, a, RC_DP_MAX_STATES)
        self.rc_dp += runs
        if done:
            return r, a2
        lb, ub, a1 = lagrangian_min_rate(self.space, allowed, None)
        self.consider(a1)
        return self.polish(allowed, None, lb, ub), a1

    def polish(self, allowed: np.ndarray, ps_v: float | None, lb: float, ub: float) -> float:
        """Close a Lagrangian duality gap with a time-capped MILP; return the best bound."""
        if closed(lb, ub) or self.left_s() <= 0:
            return lb
        self.milp += 1
        r_m, a_m = milp_min_rate(self.space, allowed, ps_v, min(self.left_s(), MILP_CALL_LIMIT_S))
        self.consider(a_m)
        return max(lb, r_m)

    # ------------------------------------------------------ Q: with PS row
    def ps_q(self, t: float, idx: int, milp: bool = False) -> tuple[float, np.ndarray | None]:
        """A lower bound on Q(t), the least rate with every T_s >= t, T_ps >= t and the
        inventory, and a placement that attains it (None if none found does).

        The PS row is discretised into PS_UNITS units of ps_capacity / t: rounding
        each option's load down relaxes it (a lower bound), rounding up tightens it
        (a feasible placement). With ``milp`` (or past RC_DP_MAX_STATES states) a
        time-capped MILP keeps the PS row exact instead. R(V[idx]) (no PS row)
        bounds Q(t) from below too."""
        if (t, milp) in self.ps_memo:
            return self.ps_memo[t, milp]
        space = self.space
        allowed = self.allowed_at(idx)
        scale = PS_UNITS * t / space.ps_capacity
        down = np.floor(space.ps * scale + 1e-9).astype(int)
        up = np.ceil(space.ps * scale - 1e-9).astype(int)
        _, a = dp_min_rate(space, allowed)
        binding = violated(space, a) if a is not None else []
        r = self.memo[idx][0]
        found: list[np.ndarray | None] = []
        while a is not None:
            if milp or np.prod([space.counts[k] + 1 for k in binding]) * (PS_UNITS + 1) > RC_DP_MAX_STATES:
                r = self.ps_q_milp(t, allowed, r, found)
                break
            self.rc_dp += 1
            r_d, a = rc_dp_min_rate(space, allowed, binding, (down, PS_UNITS))
            if a is None:
                r = np.inf
                break
            more = [k for k in violated(space, a) if k not in binding]
            if not more:                        # the relaxed optimum; if it breaks the PS
                r = max(r, r_d)                 # row, the rounded-up DP finds a feasible one
                found.append(a)
                if not self.attains(a, t, r):
                    self.rc_dp += 1
                    found.append(rc_dp_min_rate(space, allowed, binding, (up, PS_UNITS))[1])
                break
            binding += more
        for a_f in found:
            self.consider(a_f)
        self.ps_memo[t, milp] = (r, next((a_f for a_f in found if self.attains(a_f, t, r)), None))
        return self.ps_memo[t, milp]

    def ps_q_milp(self, t: float, allowed: np.ndarray, r: float, found: list[np.ndarray | None]) -> float:
        """Q(t) by the time-capped MILP with the exact PS row: the bound ``r`` raised by its
        bounds; the placements it returns are appended to ``found``.

        HiGHS meets the PS row within its tolerance: a placement it returns whose
        T_ps falls short of t is cut off (keeping the bound valid) and it re-solves,
        at most MILP_CUTS times."""
        space = self.space
        cut: list[np.ndarray] = []
        while self.left_s() > 0 and len(cut) < MILP_CUTS:
            self.milp += 1
            r_m, a_m = milp_min_rate(space, allowed, t, min(self.left_s(), MILP_CALL_LIMIT_S), cut)
            r = max(r, r_m)
            found.append(a_m)
            if a_m is None or self.attains(a_m, t, r) or \
                    space.evaluate(a_m[None, :]).throughput_sps[0] >= t * (1 - 1e-12):
                break
            cut.append(a_m)
        return r

    # ---------------------------------------------------------- node bound
    def sep_at(self, idx: int) -> float:
        """min over placements with every stage >= V[idx] of sum_s rate_s / T_s (inventory
        relaxed): since T <= T_s, cost >= hours * (this + R_ps / T)."""
        if idx not in self.sep_memo:
            r, a = dp_min_rate(self.space, self.allowed_at(idx), self.per_sample)
            self.consider(a)
            self.sep_memo[idx] = r
        return self.sep_memo[idx]

    def t_ps_max(self, idx: int) -> float:
        """The highest T_ps of a placement with every stage >= V[idx] (inventory relaxed):
        ps_capacity over the least PS load, by the same DP with the load as the rate."""
        if idx not in self.ps_min_memo:
            p, _ = dp_min_rate(self.space, self.allowed_at(idx), self.space.ps)
            self.ps_min_memo[idx] = self.space.ps_capacity / p if p > 0 else np.inf
        return self.ps_min_memo[idx]

    def bound(self, idx: int, r: float, tb: float) -> float:
        """Least cost of a placement with T <= tb, every stage >= V[idx] and rate >= r."""
        t_hi = min(tb, self.t_ps_max(idx))
        if t_hi <= 0:
            return np.inf
        ps_rate = self.space.ps_rate
        return self.hours * max((r + ps_rate) / t_hi, self.sep_at(idx) + ps_rate / t_hi)

    def t_star(self, r: float) -> float:
        """T up to which a placement of rate >= r costs no less than the incumbent."""
        if not np.isfinite(self.best):
            return 0.0
        return (r + self.space.ps_rate) * self.hours / (self.best * (1 - 1e-12))

    # -------------------------------------------------------------- search
    # Branch and bound over intervals [ta, tb] of T. Every placement with T in there
    # has every stage >= ta (the first threshold V[idx] >= ta), T_ps >= ta and T <= tb.
    # The least-rate placement p under those rows closes [ta, T(p)] at once: any
    # placement with T in it has rate >= rate(p) and T <= T(p). Without the PS row
    # (R(V[idx]), exact with the inventory DP) p may break it (T(p) < ta, the PS holds
    # it back); then Q(ta) with the PS row discretised bounds the interval, and closes
    # it when its placement attains the bound.
    def run(self) -> ExactResult:
        """Search the intervals of T to the end or the time limit; the result with its gap."""
        V = self.V
        lower = np.inf
        # (ta, tb, r): r is a lower bound on the rate over [ta, tb], inherited from the node
        # that split it (Q is non-decreasing in t, so a bound at a lower ta holds)
        stack = [(max(self.space.target, float(V[0]) * 1e-6), float(V[-1]), 0.0)] if V.size else []
        timed_out = False
        while stack:
            if self.left_s() <= 0:
                timed_out = True
                break
            ta, tb, r = stack.pop()
            lower = min(lower, self.branch(ta, tb, r, stack))
        if timed_out:
            lower = min(lower, self.open_bound(stack))
        return self.result(lower, timed_out)

    def branch(self, ta: float, tb: float, r: float, stack: list[tuple[float, float, float]]) -> float:
        """Bound the node [ta, tb] (rate >= r); unless it is pruned or closed, push its two
        halves onto ``stack``. Returns the bound the node leaves open (a PS-held interval
        too narrow to split), else inf."""
        V = self.V
        idx = int(np.searchsorted(V, ta, side="left"))
        if idx >= V.size or self.t_ps_max(idx) < ta * (1 - 1e-12):
            return np.inf                       # no placement has every stage and T_ps >= ta
        r = max(r, self.rate_at(idx))
        if not np.isfinite(r) or self.bound(idx, r, tb) >= self.best * (1 - 1e-12):
            return np.inf
        t_closed = self.attains(self.memo[idx][1], ta, r)
        if not t_closed:
            # Held back by the PS: Q(ta) with the PS row discretised. When that bound is
            # attained by no placement and prunes nothing above ta (t_star(r) <= ta), no
            # split raises it at ta itself, so the MILP keeps the PS row exact.
            for milp in (False, True):
                q, p = self.ps_q(ta, idx, milp)
                r = max(r, q)
                t_closed = self.attains(p, ta, r)
                if t_closed or self.t_star(r) > ta or self.bound(idx, r, tb) >= self.best * (1 - 1e-12):
                    break
            b = self.bound(idx, r, tb)
            if b >= self.best * (1 - 1e-12):
                return np.inf
            if not t_closed and tb <= ta * (1 + PS_REL_TOL):
                return b                        # too narrow to split: its bound counts in the gap
        # [ta, T(p)] is closed (attains() accepts T(p) a rounding error below ta, so step
        # past the larger of them), and below t_star(r) nothing beats the incumbent
        ta = max(ta * (1 + 1e-12) if t_closed else ta, t_closed * (1 + 1e-12), self.t_star(r))
        if ta > tb:
            return np.inf
        ia = int(np.searchsorted(V, ta, side="left"))
        ib = int(np.searchsorted(V, tb, side="right")) - 1
        mid = float(V[(ia + ib) // 2]) if ib - ia >= 2 else (ta * tb) ** 0.5
        stack.append((mid, tb, r))
        stack.append((ta, mid, r))
        return np.inf

    def open_bound(self, stack: list[tuple[float, float, float]]) -> float:
        """The least bound over the intervals left open at the time limit: R is
        non-decreasing, so the nearest solved threshold below each one bounds it."""
        V, lower = self.V, np.inf
        for ta, tb, r in stack:
            i = min(int(np.searchsorted(V, ta, side="left")), V.size - 1)
            ra = max([r] + [self.memo[j][0] for j in self.memo if j <= i])
            lower = min(lower, self.bound(i, ra, tb))
        return lower

    def result(self, lower: float, timed_out: bool) -> ExactResult:
        """The incumbent with its lower bound and gap."""
        best = self.best
        lb = min(lower, best)
        if not np.isfinite(best):
            # nothing found: proven infeasible only when no interval was left open
            gap = np.inf if timed_out or np.isfinite(lower) else 0.0
        else:
            gap = 0.0 if lb >= best else (best - lb) / best
        return ExactResult(self.a, best, lb, gap, int(self.V.size), len(self.memo),
                           self.milp, self.rc_dp, time.perf_counter() - self.t0, timed_out)


@register("exact")
class Exact(PlacementScheduler):
    """The cost-optimal placement (branch and bound over T with DPs over layer segments; see the module).

    Args:
        time_limit_s: wall-clock budget; past it the best placement found is
            returned with its lower bound and gap in ``plan.options["exact"]``.
    """

    def __init__(self, time_limit_s: float = 10.0) -> None:
        if time_limit_s <= 0:
            raise ValueError("time_limit_s must be > 0")
        self.time_limit_s = time_limit_s
        self.last: ExactResult | None = None

    def plan(self, problem: Problem) -> Plan:
        if problem.objective.minimize != "cost":
            raise ConfigError("<config>", "objective.minimize",
                              f"exact minimises cost; got {problem.objective.minimize!r}")
        space = PlacementSpace(problem)
        res = self.last = solve(space, self.time_limit_s)
        if res.assignment is None:
            if res.timed_out:
                raise PlacementInfeasible(
                    f"exact: no placement meeting throughput_min={space.target:.4g} samples/s found "
                    f"within time_limit_s={self.time_limit_s:g}; raise the limit")
            raise PlacementInfeasible("exact: " + space.describe_infeasible())
        plan = space.to_plan(res.assignment, self.name)
        plan.options["exact"] = {"lower_bound_usd": res.lower_bound_usd, "gap": res.gap,
                                 "proven_optimal": res.proven,
                                 "thresholds": res.thresholds, "solves": res.solves,
                                 "milp_solves": res.milp_solves, "rc_dp_solves": res.rc_dp_solves,
                                 "seconds": res.seconds}
        return plan

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        return solve(space, self.time_limit_s).assignment


def usage(space: PlacementSpace, a: np.ndarray) -> np.ndarray:
    """Devices of each type a placement provisions."""
    used = np.zeros(space.K, dtype=int)
    for j, i, k in space.stages_of(a):
        used[k] += int(space.n[space.seg_index[j, i], k])
    return used


def rate_of(space: PlacementSpace, a: np.ndarray) -> float:
    """The provisioned devices' price per hour of placement ``a`` (the PS shards' left out)."""
    return float(sum(space.rate[space.seg_index[j, i], k] for j, i, k in space.stages_of(a)))


def violated(space: PlacementSpace, a: np.ndarray) -> list[int]:
    """Device types of which placement ``a`` provisions more than the inventory holds."""
    return [int(k) for k in np.flatnonzero(usage(space, a) > space.counts)]


def inventory_dp(space: PlacementSpace, allowed: np.ndarray, a: np.ndarray,
                 max_states: float = np.inf) -> tuple[float, np.ndarray | None, int, bool]:
    """The least rate under the inventory, starting from the unconstrained DP's placement
    ``a``: the violated types join the DP state (:func:`rc_dp_min_rate`) until none is.

    Returns (rate, placement or None when none fits, DP runs, done); ``done`` is False
    when the state would pass ``max_states`` (rate and placement are then ``a``'s).
    """
    binding: list[int] = []
    runs = 0
    while True:
        more = [k for k in violated(space, a) if k not in binding]
        if not more:
            return float(sum(space.rate[space.seg_index[j, i], k] for j, i, k in space.stages_of(a))), a, runs, True
        binding += more
        if np.prod([space.counts[k] + 1 for k in binding]) > max_states:
            return np.inf, a, runs, False
        runs += 1
        _, a2 = rc_dp_min_rate(space, allowed, binding)
        if a2 is None:
            return np.inf, None, runs, True
        a = a2
