"""`exact`: the proven cost optimum of a placement (Problem B), or a bound and its gap.

The cost of a placement is ``(R + R_ps) * samples / T / 3600`` where R is the
provisioned devices' price per hour and T the plan's throughput, the minimum
of its stages' throughputs ``T_s`` and the PS bound. Provisioning fixes each
stage's (segment, type) replicas, so every stage option has a fixed rate and
throughput (:class:`sim.placement.PlacementSpace`). The ratio makes the cost
non-separable; it is minimised by a search over the bottleneck throughput:

* For a threshold V, ``R(V)`` = the least rate of a placement whose stages all
  have ``T_s >= V``: a dynamic programme over layer boundaries with the last
  stage's type as state (consecutive stages differ in type: one type's
  consecutive layers form one stage), O(L^2 K) per threshold. When its
  placement uses more devices of a type than the inventory holds, the
  violated types' usage joins the DP state (a resource-constrained shortest
  path, exact; :func:`rc_dp_min_rate`) until no type is violated. Only past
  ``RC_DP_MAX_STATES`` states does a Lagrangian bound plus a time-capped MILP
  (scipy.optimize.milp, HiGHS) over stage options x[segment, type] with flow,
  no-repeated-type and inventory rows take over.
* Branch and bound over intervals [V_a, V_b] of the sorted distinct stage
  throughputs. A placement whose smallest stage throughput m is in the
  interval costs at least ``hours * max((R(V_a) + R_ps) / V_b,
  S(V_a) + R_ps / V_b)``, where S(V) is the least sum of per-stage
  ``rate_s / T_s`` (T never exceeds any T_s). The least-rate placement p at
  V_a closes [V_a, T(p)] at once: any placement with m there has rate >=
  R(V_a) and T <= m <= T(p).

The PS bound can hold a placement's T below its smallest stage throughput
(T = T_ps, off the grid of stage throughputs). When the least-rate placement
at some threshold is PS-bound, a second branch and bound runs on T itself
over [throughput_min, highest such threshold]: Q(t), the least rate with
every T_s >= t, T_ps >= t and the inventory, comes from the same DP with the
PS load as one more resource, discretised into ``PS_UNITS`` units of
``ps_capacity / t`` (loads rounded down: a lower bound; rounded up: a
feasible placement). Intervals of T narrower than ``PS_REL_TOL`` stay open
and their bound counts in the gap. The result is proven optimal when no
interval stays open (gap 0); otherwise ``gap = (best - lower_bound) / best``
says how far from proven it is. The incumbent starts from the heuristics
(single-type plans, greedy, a short genetic run), so exact is never worse
than they are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from schedulers.base import register
from schedulers.placement import PlacementScheduler
from sim.errors import ConfigError
from sim.placement import PlacementInfeasible, PlacementSpace
from sim.plan import Plan
from sim.problem import Problem

#: Wall-clock cap of one MILP call (HiGHS returns its incumbent and dual bound past it).
MILP_CALL_LIMIT_S = 5.0
#: Generations of the genetic run that seeds the incumbent.
INCUMBENT_GENERATIONS = 40
#: Units the PS bound is discretised into (per threshold) in the DP.
PS_UNITS = 256
#: Relative width below which a PS-bound interval of T is left open (its bound counts in the gap).
PS_REL_TOL = 1e-6
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
    ending at i are grouped by their usage, so the shift is one array
    operation per group.
    """
    L, K = space.L, space.K
    dims = [int(space.counts[k]) + 1 for k in binding] + ([int(extra[1]) + 1] if extra else [])
    U = int(np.prod(dims)) if dims else 1
    axis = {k: a for a, k in enumerate(binding)}
    units = extra[0] if extra else None
    rate = np.where(allowed, space.rate, np.inf)
    best = np.full((L + 1, K, U), np.inf)
    from_j = np.zeros((L + 1, K, U), dtype=np.int32)
    excl = np.full((L + 1, K, U), np.inf)
    excl_k = np.full((L + 1, K, U), -1, dtype=np.int32)
    excl[0, :, 0] = 0.0

    def shifts(k: int, n: int, unit: int) -> list[int]:
        out = [0] * len(dims)
        if k in axis:
            out[axis[k]] = n
        if extra:
            out[-1] = unit
        return out


    def shift(x: np.ndarray, by: list[int]) -> np.ndarray:
        if not any(by):
            return x
        if any(d >= n for d, n in zip(by, dims)):
            return np.full(U, np.inf)
        y = np.full(dims, np.inf)
        src = x.reshape(dims)
        y[tuple(slice(d, None) for d in by)] = src[tuple(slice(0, n - d) for d, n in zip(by, dims))]
        return y.reshape(U)

    for i in range(1, L + 1):
        js = np.arange(i)
        segs = space.seg_index[js, i]
        for k in range(K):
            r = rate[segs, k]
            ok = np.isfinite(r)
            if not ok.any():
                continue
            ns = space.n[segs, k]
            for n in np.unique(ns[ok]):
                sel = js[ok & (ns == n)]
                cand = excl[sel, k] + rate[segs[sel], k][:, None]       # (m, U)
                if units is not None:                                   # per-row shift on the last axis
                    g = dims[-1]
                    c3 = cand.reshape(len(sel), -1, g)
                    idx = np.arange(g)[None, :] - units[segs[sel], k][:, None]   # (m, g)
                    take = np.take_along_axis(c3, np.broadcast_to(np.maximum(idx, 0)[:, None, :], c3.shape), axis=2)
                    cand = np.where((idx >= 0)[:, None, :], take, np.inf).reshape(len(sel), U)
                arg = np.argmin(cand, axis=0)
                by = shifts(k, int(n), 0)
                m = shift(cand[arg, np.arange(U)], by)
                src_j = shift(sel[arg].astype(float), by)
                better = m < best[i, k]
                best[i, k][better] = m[better]
                from_j[i, k][better] = src_j[better].astype(np.int32)
        if i < L:
            order = np.argsort(best[i], axis=0, kind="stable")           # (K, U)
            k1 = order[0]
            k2 = order[1] if K > 1 else order[0]
            us_ = np.arange(U)
            for k in range(K):
                use2 = k1 == k
                excl[i, k] = np.where(use2, best[i, k2, us_] if K > 1 else np.inf, best[i, k1, us_])
                excl_k[i, k] = np.where(use2, k2 if K > 1 else -1, k1)
    flat = int(np.argmin(best[L].reshape(-1)))
    k, u = divmod(flat, U)
    if not np.isfinite(best[L, k, u]):
        return np.inf, None
    a_out = np.empty(L, dtype=int)
    i = L
    while i > 0:
        j = int(from_j[i, k, u])
        seg = space.seg_index[j, i]
        a_out[j:i] = k
        by = shifts(k, int(space.n[seg, k]), int(units[seg, k]) if units is not None else 0)
        if any(by):  # usage before this stage
            idx = np.array(np.unravel_index(u, dims)) - np.array(by)
            u = int(np.ravel_multi_index(tuple(idx), dims))
        i, k = j, int(excl_k[j, k, u]) if j > 0 else -1
    return float(best[L].min()), a_out


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
                  time_limit_s: float) -> tuple[float, np.ndarray | None]:
    """Least rate with the inventory (and, given ``ps_threshold``, PS bandwidth) enforced."""
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
    res = milp(space.rate[s_idx, k_idx], integrality=np.ones(nv), bounds=Bounds(0, 1),
               constraints=LinearConstraint(csr_array(np.array(rows)), lo, hi),
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})
    if res.x is None:
        return np.inf, None
    # past the time limit HiGHS returns its incumbent; the dual bound is what stays a valid bound
    bound = float(res.fun) if res.status == 0 else float(getattr(res, "mip_dual_bound", -np.inf))
    a = np.empty(L, dtype=int)
    for v in np.flatnonzero(res.x > 0.5):
        a[sj[v]:si[v]] = k_idx[v]
    return bound, a


def solve(space: PlacementSpace, time_limit_s: float = 60.0) -> ExactResult:
    """Branch and bound over the bottleneck stage throughput (module docstring)."""
    t0 = time.perf_counter()
    feas = space.n > 0
    V = np.unique(space.tput[feas])
    hours = space.samples / 3600.0
    memo: dict[int, tuple[float, np.ndarray | None]] = {}
    state: dict = {"best": np.inf, "a": None, "milp": 0, "rc_dp": 0}

    def consider(a: np.ndarray | None) -> None:
        if a is None:
            return
        ev = space.evaluate(a[None, :])
        if ev.feasible[0] and ev.cost_usd[0] < state["best"]:
            state["best"], state["a"] = float(ev.cost_usd[0]), a

    def consider_many(A: np.ndarray) -> None:
        ev = space.evaluate(A)
        i = int(np.argmin(ev.cost_usd))
        if ev.feasible[i] and ev.cost_usd[i] < state["best"]:
            state["best"], state["a"] = float(ev.cost_usd[i]), A[i]

    def rate_at(idx: int) -> float:
        """A lower bound on R(V[idx]) under the inventory; records candidate placements."""
        if idx in memo:
            return memo[idx][0]
        v = float(V[idx])
        allowed = feas & (space.tput >= v)
        r, a = dp_min_rate(space, allowed)
        if a is not None:
            ev = space.evaluate(a[None, :])
            consider(a)
            if not ev.inventory_ok[0]:      # binding types into the DP state
                r, a = inventory_min_rate(allowed, a)
                consider(a)
        memo[idx] = (r, a)
        return r

    def inventory_min_rate(allowed: np.ndarray, a: np.ndarray) -> tuple[float, np.ndarray | None]:
        """Exact R(V) under the inventory: add violated types to the DP state until none is
        violated; past RC_DP_MAX_STATES states, a Lagrangian bound and a time-capped MILP."""
        r, a2, runs, done = inventory_dp(space, allowed, a, RC_DP_MAX_STATES)
        state["rc_dp"] += runs
        if done:
            return r, a2
        lb, ub, a1 = lagrangian_min_rate(space, allowed, None)
        consider(a1)
        return polish(allowed, None, lb, ub), a1

    def ps_q(t: float) -> tuple[float, np.ndarray | None, bool]:
        """A lower bound on Q(t), the least rate with every T_s >= t, T_ps >= t and the
        inventory; a placement found for it; whether the bound is Q(t) itself.

        The PS row is discretised into PS_UNITS units of ps_capacity / t: rounding
        each option's load down relaxes it (a lower bound), rounding up tightens it
        (a feasible placement)."""
        allowed = feas & (space.tput >= t)
        _, a = dp_min_rate(space, allowed)
        if a is None:
            return np.inf, None, True
        scale = PS_UNITS * t / space.ps_capacity
        down = np.floor(space.ps * scale + 1e-9).astype(int)
        up = np.ceil(space.ps * scale - 1e-9).astype(int)
        binding = violated(space, a)
        while True:
            if np.prod([space.counts[k] + 1 for k in binding]) * (PS_UNITS + 1) > RC_DP_MAX_STATES:
                left = time_limit_s - (time.perf_counter() - t0)   # too many states: a MILP
                if left <= 0:                                      # with the PS row, capped
                    return memo_floor(t), None, False
                state["milp"] += 1
                r_m, a_m = milp_min_rate(space, allowed, t, min(left, MILP_CALL_LIMIT_S))
                consider(a_m)
                return max(memo_floor(t), r_m), a_m, False
            state["rc_dp"] += 1
            r, a = rc_dp_min_rate(space, allowed, binding, (down, PS_UNITS))
            if a is None:
                return np.inf, None, True
            more = [k for k in violated(space, a) if k not in binding]
            if not more:
                break
            binding += more
        consider(a)
        if space.evaluate(a[None, :]).throughput_sps[0] >= t * (1 - 1e-12):
            return r, a, True
        state["rc_dp"] += 1
        _, a_up = rc_dp_min_rate(space, allowed, binding, (up, PS_UNITS))
        consider(a_up)
        return r, a_up, False

    def memo_floor(t: float) -> float:
        """R at the largest solved threshold <= t (R without the PS row is a lower bound)."""
        i = int(np.searchsorted(V, t, side="right")) - 1
        return max((memo[j][0] for j in memo if j <= i), default=0.0)

    def ps_pass(t_lo: float, t_hi: float) -> tuple[float, bool]:
        """Branch and bound on T itself over [t_lo, t_hi] for placements the PS holds back."""
        low = np.inf
        todo = [(t_lo, t_hi)]
        while todo:
            if time.perf_counter() - t0 > time_limit_s:
                for ta, tb in todo:
                    low = min(low, (memo_floor(ta) + space.ps_rate) * hours / tb)
                return low, True
            ta, tb = todo.pop()
            q, p, exact_q = ps_q(ta)
            if not np.isfinite(q):
                continue
            bnd = (q + space.ps_rate) * hours / tb
            if bnd >= state["best"] * (1 - 1e-12):
                continue
            if exact_q and p is not None:   # p is the least-rate placement with T >= ta
                tp = float(space.evaluate(p[None, :]).throughput_sps[0])
                if tp >= tb:
                    continue
                ta = max(ta, tp * (1 + 1e-12))
            if tb / ta <= 1 + PS_REL_TOL:
                low = min(low, bnd)
                continue
            mid = (ta * tb) ** 0.5
            todo.append((mid, tb))
            todo.append((ta, mid))
        return low, False

    def polish(allowed: np.ndarray, ps_v: float | None, lb: float, ub: float) -> float:
        """Close a Lagrangian duality gap with a time-capped MILP; return the best bound."""
        left = time_limit_s - (time.perf_counter() - t0)
        if closed(lb, ub) or left <= 0:
            return lb
        state["milp"] += 1
        r_m, a_m = milp_min_rate(space, allowed, ps_v, min(left, MILP_CALL_LIMIT_S))
        consider(a_m)
        return max(lb, r_m)

    # incumbents from the heuristics: single-type plans, greedy and a short genetic run
    from schedulers.placement import Genetic, Greedy

    consider_many(np.repeat(np.arange(space.K)[:, None], space.L, axis=1))
    consider(Greedy().search(space, "cost"))
    consider(Genetic(generations=INCUMBENT_GENERATIONS, seed=0).search(space, "cost"))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_sample = np.where(feas, space.rate / space.tput, np.inf)   # $/h per (sample/s)
    sep_memo: dict[int, float] = {}

    def sep_at(idx: int) -> float:
        """min over placements with every stage >= V[idx] of sum_s rate_s / T_s (inventory
        relaxed): since T <= T_s, cost >= hours * (this + R_ps / T)."""
        if idx not in sep_memo:
            r, a = dp_min_rate(space, feas & (space.tput >= V[idx]), per_sample)
            consider(a)
            sep_memo[idx] = r
        return sep_memo[idx]

    # Branch and bound over intervals [V[a], V[b]] of the smallest stage throughput m.
    # The least-rate placement p at V[a] closes [V[a], T(p)]: any placement with m in it
    # has rate >= R(V[a]) and T <= m <= T(p). A placement held back by the PS
    # (T(p) < V[a]) leaves those with T_ps < V[a] bounded by (R + R_ps) * hours / V[a].
    lower = np.inf
    ps_hi = 0.0
    stack = [(0, V.size - 1)] if V.size else []
    timed_out = False
    while stack:
        if time.perf_counter() - t0 > time_limit_s:
            timed_out = True
            break
        a_i, b_i = stack.pop()
        if a_i > b_i:
            continue
        r = rate_at(a_i)
        if not np.isfinite(r):
            continue                                   # no placement has every stage >= V[a_i]
        lb_ab = hours * max((r + space.ps_rate) / V[b_i], sep_at(a_i) + space.ps_rate / V[b_i])
        if lb_ab >= state["best"] * (1 - 1e-12):
            continue
        p = memo[a_i][1]
        t_p = float(space.evaluate(p[None, :]).throughput_sps[0]) if p is not None else 0.0
        if t_p < V[a_i] * (1 - 1e-12):   # PS-bound: settled by the PS pass below
            if ps_hi == 0.0:               # an incumbent that respects the PS, to prune with
                ps_q(max(space.target, float(V[0]) * 1e-6))
            ps_hi = max(ps_hi, float(V[a_i]))
            t_p = float(V[a_i])
        a_i = max(a_i + 1, int(np.searchsorted(V, t_p * (1 + 1e-12), side="right")))
        if a_i > b_i:
            continue
        mid = (a_i + b_i) // 2
        stack.append((mid + 1, b_i))
        stack.append((a_i, mid))
    if timed_out:  # open intervals: R is non-decreasing, so the nearest solved threshold below bounds it
        for a_i, b_i in stack:
            ra = max((memo[i][0] for i in memo if i <= a_i), default=0.0)
            sp = max((sep_memo[i] for i in sep_memo if i <= a_i), default=0.0)
            lower = min(lower, hours * max((ra + space.ps_rate) / V[b_i], sp + space.ps_rate / V[b_i]))
    if ps_hi > 0:
        lo_ps, timed = ps_pass(max(space.target, float(V[0]) * 1e-6), ps_hi)
        lower = min(lower, lo_ps)
        timed_out = timed_out or timed
    best = state["best"]
    lb = min(lower, best)
    if not np.isfinite(best):
        gap = np.inf if timed_out else 0.0     # nothing found in time / proven infeasible
    else:
        gap = 0.0 if lb >= best else (best - lb) / best
    return ExactResult(state["a"], best, lb, gap, int(V.size), len(memo),
                       state["milp"], state["rc_dp"], time.perf_counter() - t0, timed_out)


@register("exact")
class Exact(PlacementScheduler):
    """The cost-optimal placement (DP over layer segments; MILP when the inventory binds).

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
