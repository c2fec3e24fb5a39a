"""Schedulers for periodic task DAGs on embedded boards (kind "dag"): DagProblem -> DagPlan.

* ``heft``: Heterogeneous Earliest Finish Time (Topcuoglu, Hariri and Wu, IEEE TPDS
  2002): tasks by decreasing upward rank, each on the unit giving the earliest
  finish time, with insertion into idle gaps; in the power mode where that is
  shortest (a makespan scheduler: the baseline that ignores energy).
* ``energy``: an energy-aware list scheduler. Same task order; each task goes on
  the unit that adds the least busy energy among those that still let the
  deadline be met (its finish must leave room for the fastest possible
  execution of the tasks after it) and keep the unit's load within one period;
  every power mode is tried and the least total energy that meets the deadline
  wins. HEFT's own schedule in each mode is a candidate too. On small graphs
  (``exact_max_tasks``) where neither heuristic meets the deadline in any mode,
  it asks the exact solver whether any schedule can, so it never misses a
  deadline that the exact solver meets; beyond that size there is no such
  guarantee (the problem is NP-hard) and the plan reports the miss.
* ``milp``: exact, by mixed-integer programming (scipy's HiGHS) per power mode:
  minimum energy subject to the deadline and the period (``objective: energy``)
  or minimum makespan (``objective: makespan``). For small graphs: the
  disjunctive formulation grows with the square of the task count.

All three work on :class:`sim.dag.DagCosts` arrays, one power mode at a time, priced
by :func:`sim.dag.planning_costs`: execution times scaled by the problem's
``time_scale`` (the slowdowns the frames DES applies), so a plan that meets the
deadline on paper also meets it under them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from schedulers.base import instantiate, register
from sim.dag import DagCosts, DagPlan, DagProblem, compact_schedule, planning_costs
from sim.scheduling import DagScheduler


def make_dag(name: str, params: dict[str, Any] | None = None, source: str = "<config>") -> DagScheduler:
    """Instantiate a registered DAG scheduler; one-line ConfigError on misuse."""
    return instantiate(name, params, source, "dag")  # type: ignore[no-any-return]


# ---------------------------------------------------------------- list scheduling


def upward_rank(c: DagCosts) -> np.ndarray:
    """HEFT's rank_u: mean runnable time of the task plus the longest (mean time +
    transfer) path to an exit task."""
    t = np.where(np.isfinite(c.time_s), c.time_s, np.nan)
    mean = np.nanmean(t, axis=1)
    rank = np.zeros(len(c.tasks))
    for i in reversed(c.topo()):
        rank[i] = mean[i] + max((c.comm_s[k] + rank[j] for j, k in c.succs[i]), default=0.0)
    return rank


def rank_order(c: DagCosts) -> list[int]:
    """Tasks by decreasing upward rank (ties: lower index). A topological order,
    since a task's rank exceeds each successor's."""
    rank = upward_rank(c)
    return sorted(range(len(c.tasks)), key=lambda i: (-rank[i], i))


class _Timeline:
    """Busy intervals of each unit, sorted; earliest-start search with insertion."""

    def __init__(self, n_units: int) -> None:
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(n_units)]

    def earliest(self, u: int, ready: float, dur: float) -> float:
        t = ready
        for a, b in self.busy[u]:
            if t + dur <= a:
                return t
            t = max(t, b)
        return t

    def add(self, u: int, start: float, dur: float) -> None:
        self.busy[u].append((start, start + dur))
        self.busy[u].sort()


#: choose(task, [(unit, start, finish)], state) -> unit; state has the loads so far.
Chooser = Callable[[int, list[tuple[int, float, float]], np.ndarray], int]


def list_schedule(c: DagCosts, order: Sequence[int], choose: Chooser, scheduler: str) -> DagPlan:
    """Place tasks in ``order`` (topological), each on the unit ``choose`` picks among
    the runnable ones, at its earliest start (insertion into idle gaps allowed)."""
    n = len(c.tasks)
    unit = [-1] * n
    start, finish = np.zeros(n), np.zeros(n)
    load = np.zeros(len(c.units))
    tl = _Timeline(len(c.units))
    for i in order:
        options: list[tuple[int, float, float]] = []
        for v in (int(x) for x in np.flatnonzero(np.isfinite(c.time_s[i]))):
            ready = max((finish[p] + (c.comm_s[k] if unit[p] != v else 0.0) for p, k in c.preds[i]),
                        default=0.0)
            sv = tl.earliest(v, ready, c.time_s[i, v])
            options.append((v, sv, sv + c.time_s[i, v]))
        u = choose(i, options, load)
        s = next(o[1] for o in options if o[0] == u)
        unit[i], start[i], finish[i] = u, s, s + c.time_s[i, u]
        load[u] += c.time_s[i, u]
        tl.add(u, s, c.time_s[i, u])
    return DagPlan(c.mode, tuple(unit), tuple(float(x) for x in start), scheduler)


def heft_schedule(c: DagCosts) -> DagPlan:
    """HEFT in one power mode: earliest finish time (ties: lower unit index)."""
    return list_schedule(c, rank_order(c), lambda i, opts, load: min(opts, key=lambda o: (o[2], o[0]))[0],
                         "heft")


def tails(c: DagCosts) -> np.ndarray:
    """[task] optimistic time from a task's finish to the frame's end: the longest
    path of fastest execution times after it, with no transfers (a lower bound)."""
    fastest = np.min(c.time_s, axis=1)
    tail = np.zeros(len(c.tasks))
    for i in reversed(c.topo()):
        tail[i] = max((fastest[j] + tail[j] for j, _ in c.succs[i]), default=0.0)
    return tail


def energy_schedule(c: DagCosts) -> DagPlan:
    """The energy-aware list schedule in one power mode (module docstring)."""
    lft = c.deadline_s - tails(c)

    def choose(i: int, opts: list[tuple[int, float, float]], load: np.ndarray) -> int:
        ok = [o for o in opts if o[2] <= lft[i] * (1 + 1e-12) and load[o[0]] + c.time_s[i, o[0]]
              <= c.period_s * (1 + 1e-12)]
        if not ok:
            return min(opts, key=lambda o: (o[2], o[0]))[0]
        return min(ok, key=lambda o: (c.time_s[i, o[0]] * c.busy_w[o[0]], o[2], o[0]))[0]

    return list_schedule(c, rank_order(c), choose, "energy")


def best_plan(cands: list[tuple[DagPlan, DagCosts]]) -> tuple[DagPlan, DagCosts]:
    """Least energy among feasible plans; with none feasible, the shortest makespan."""
    ok = [pc for pc in cands if pc[0].feasible(pc[1])]
    if ok:
        return min(ok, key=lambda pc: (pc[0].energy_j(pc[1]), pc[0].makespan_s(pc[1])))
    return min(cands, key=lambda pc: (pc[0].makespan_s(pc[1]), pc[0].energy_j(pc[1])))


def _relabel(plan: DagPlan, name: str, proven: bool | None = None) -> DagPlan:
    return DagPlan(plan.mode, plan.unit, plan.start_s, name, plan.proven if proven is None else proven)


@register("heft", kind="dag")
class Heft:
    """HEFT as published: the shortest frame, so the power mode where HEFT's schedule
    is shortest (ties: less energy). It knows nothing of energy beyond that tie."""

    name: ClassVar[str]

    def plan(self, problem: DagProblem) -> DagPlan:
        cands = [(heft_schedule(c), c) for c in (planning_costs(problem, m) for m in problem.allowed_modes)]
        best, _ = min(cands, key=lambda pc: (pc[0].makespan_s(pc[1]), pc[0].energy_j(pc[1])))
        return _relabel(best, self.name)


@register("energy", kind="dag")
class EnergyAware:
    """Energy-aware list scheduling over units and power modes (module docstring).

    Args:
        margin: plan against ``(1 - margin) x`` the deadline, where any plan meets
            that, leaving slack for execution jitter and background load; when none
            does, plan against the deadline itself.
        exact_max_tasks: graphs up to this many tasks fall back to the exact solver
            when no heuristic schedule meets the deadline.
        time_limit_s: that fallback's time limit per power mode.
    """

    name: ClassVar[str]

    def __init__(self, margin: float = 0.0, exact_max_tasks: int = 12, time_limit_s: float = 10.0) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError("margin must be in [0, 1)")
        self.margin = margin
        self.exact_max_tasks = exact_max_tasks
        self.time_limit_s = time_limit_s
        self.used_exact = False

    def plan(self, problem: DagProblem) -> DagPlan:
        costs = [planning_costs(problem, m) for m in problem.allowed_modes]
        self.used_exact = False
        if self.margin > 0:
            tight = [dataclasses.replace(c, deadline_s=c.deadline_s * (1.0 - self.margin)) for c in costs]
            best, c = best_plan([(p, c) for c in tight for p in (energy_schedule(c), heft_schedule(c))])
            if best.feasible(c):
                return _relabel(best, self.name, proven=False)
        best, c = best_plan([(p, c) for c in costs for p in (energy_schedule(c), heft_schedule(c))])
        if not best.feasible(c) and len(problem.graph) <= self.exact_max_tasks:
            # Is the deadline reachable at all? The exact minimum-energy schedule answers.
            ex = [(p, cc) for cc in costs if (p := solve_milp(cc, "energy", self.time_limit_s)) is not None]
            if ex:
                self.used_exact = True
                best, c = best_plan(ex)
        return _relabel(best, self.name, proven=False)


# ---------------------------------------------------------------- exact (MILP)


def _reaches(c: DagCosts) -> np.ndarray:
    """[i, j] True when j is reachable from i (i != j)."""
    n = len(c.tasks)
    r = np.zeros((n, n), dtype=bool)
    for i in reversed(c.topo()):
        for j, _ in c.succs[i]:
            r[i, j] = True
            r[i] |= r[j]
    return r


def solve_milp(c: DagCosts, objective: str = "energy", time_limit_s: float = 10.0,
               respect_period: bool = True) -> DagPlan | None:
    """The exact schedule of one frame in ``c``'s power mode, or None when infeasible.

    Variables: x[i,u] (task i on unit u), start s[i], makespan C, z[e] (edge e
    crosses units), q[i,j] (tasks i, j share a unit) and y[i,j] (i before j)
    for every pair not ordered by the graph. Big-M disjunctions keep two tasks
    on one unit apart. ``objective``: "energy" (busy energy; makespan <=
    deadline) or "makespan". With ``respect_period`` each unit's load per frame
    is at most the period.
    """
    n, nu = len(c.tasks), len(c.units)
    # Times in units of a bound on any schedule's makespan (so big-M = 1): HiGHS's
    # absolute tolerances (1e-6) would otherwise be a large share of millisecond tasks.
    horizon = float(sum(np.max(c.time_s[i][np.isfinite(c.time_s[i])]) for i in range(n)) + c.comm_s.sum())
    horizon = horizon if horizon > 0 else 1.0
    # HiGHS reports "Solve error" (status 4) on some small instances of this model
    # (scipy 1.17): first with presolve, then on some without it too. The same model
    # in a longer horizon unit (looser big-M) solves; up to three units are tried.
    for slack in (1.0, 1.5, 2.5):
        args, xi, s0 = _milp_model(c, objective, respect_period, horizon * slack)
        for presolve in (True, False):
            res = milp(**args, options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9, "presolve": presolve})
            if res.status != 4:
                break
        if res.status != 4:
            break
    if res.x is None:
        return None
    x = res.x
    unit = [max(range(nu), key=lambda u: x[xi[i, u]] if (i, u) in xi else -1.0) for i in range(n)]
    plan = compact_schedule(c, unit, [float(x[s0 + i]) for i in range(n)])
    return DagPlan(c.mode, plan.unit, plan.start_s, "milp", proven=bool(res.status == 0))


def _milp_model(c: DagCosts, objective: str, respect_period: bool, horizon: float
                ) -> tuple[dict[str, Any], dict[tuple[int, int], int], int]:
    """scipy.optimize.milp's arguments for :func:`solve_milp`'s model with times in
    ``horizon`` units, the index of x[i,u] and the index of s[0]."""
    n, nu = len(c.tasks), len(c.units)
    runnable = [(i, u) for i in range(n) for u in range(nu) if math.isfinite(c.time_s[i, u])]
    xi = {iu: k for k, iu in enumerate(runnable)}
    nx = len(runnable)
    s0, cm = nx, nx + n
    z0 = cm + 1
    reach = _reaches(c)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if not reach[i, j] and not reach[j, i]]
    q0 = z0 + len(c.edges)
    y0 = q0 + len(pairs)
    nv = y0 + len(pairs)
    ts, cs = c.time_s / horizon, c.comm_s / horizon
    big = 1.0
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coef: dict[int, float], lb: float, ub: float) -> None:
        rows.append(coef)
        lo.append(lb)
        hi.append(ub)

    def dur(i: int, sign: float = 1.0) -> dict[int, float]:
        return {xi[i, u]: sign * ts[i, u] for u in range(nu) if (i, u) in xi}

    for i in range(n):  # one unit each
        row({xi[i, u]: 1.0 for u in range(nu) if (i, u) in xi}, 1.0, 1.0)
        row({s0 + i: 1.0, cm: -1.0, **dur(i)}, -np.inf, 0.0)  # finish <= C
    for k, (a, b) in enumerate(c.edges):
        row({s0 + a: 1.0, s0 + b: -1.0, z0 + k: cs[k], **dur(a)}, -np.inf, 0.0)
        for u in range(nu):
            if (a, u) in xi:  # z >= x[a,u] - x[b,u]
                coef = {xi[a, u]: 1.0, z0 + k: -1.0}
                if (b, u) in xi:
                    coef[xi[b, u]] = -1.0
                row(coef, -np.inf, 0.0)
    for p, (i, j) in enumerate(pairs):
        for u in range(nu):
            if (i, u) in xi and (j, u) in xi:  # q >= x[i,u] + x[j,u] - 1
                row({xi[i, u]: 1.0, xi[j, u]: 1.0, q0 + p: -1.0}, -np.inf, 1.0)
        # q=1, y=1: i before j;  q=1, y=0: j before i
        row({s0 + i: 1.0, s0 + j: -1.0, y0 + p: big, q0 + p: big, **dur(i)}, -np.inf, 2 * big)
        row({s0 + j: 1.0, s0 + i: -1.0, y0 + p: -big, q0 + p: big, **dur(j)}, -np.inf, big)
    if respect_period and math.isfinite(c.period_s):
        for u in range(nu):
            coef = {xi[i, u]: ts[i, u] for i in range(n) if (i, u) in xi}
            if coef:
                row(coef, -np.inf, c.period_s / horizon)
    obj = np.zeros(nv)
    cm_hi = big if objective == "makespan" or not math.isfinite(c.deadline_s) else c.deadline_s / horizon
    if objective == "energy":
        for (i, u), k in xi.items():
            obj[k] = ts[i, u] * c.busy_w[u]
        obj[cm] = 1e-9  # among equal energies, prefer the shorter frame
    elif objective == "makespan":
        obj[cm] = 1.0
    else:
        raise ValueError(f"objective must be 'energy' or 'makespan', not {objective!r}")
    mat = np.zeros((len(rows), nv))
    for r, coef in enumerate(rows):
        for k, v in coef.items():
            mat[r, k] += v
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    integrality[y0:] = 1
    ub = np.full(nv, big)
    ub[:nx] = 1.0
    ub[z0:] = 1.0
    ub[cm] = cm_hi
    args = dict(c=obj, constraints=LinearConstraint(mat, lo, hi), integrality=integrality,
                bounds=Bounds(np.zeros(nv), ub))
    return args, xi, s0


@register("milp", kind="dag")
class Milp:
    """Exact schedule per power mode by MILP; the best over modes.

    Args:
        objective: "energy" (minimum energy meeting deadline and period) or "makespan".
        time_limit_s: per power mode; the plan says whether optimality was proven.
    """

    name: ClassVar[str]

    def __init__(self, objective: str = "energy", time_limit_s: float = 30.0) -> None:
        if objective not in ("energy", "makespan"):
            raise ValueError("objective must be 'energy' or 'makespan'")
        self.objective = objective
        self.time_limit_s = time_limit_s

    def plan(self, problem: DagProblem) -> DagPlan:
        cands: list[tuple[DagPlan, DagCosts]] = []
        for m in problem.allowed_modes:
            c = planning_costs(problem, m)
            p = solve_milp(c, self.objective, self.time_limit_s, respect_period=self.objective == "energy")
            if p is not None:
                cands.append((p, c))
        if not cands:
            # No schedule meets deadline and period in any mode: the shortest frame
            # there is (exact too), which shows by how much the deadline is out of reach.
            for m in problem.allowed_modes:
                c = planning_costs(problem, m)
                p = solve_milp(c, "makespan", self.time_limit_s, respect_period=False)
                if p is not None:
                    cands.append((p, c))
        if self.objective == "makespan" or not any(p.feasible(c) for p, c in cands):
            best, _ = min(cands, key=lambda pc: (pc[0].makespan_s(pc[1]), pc[0].energy_j(pc[1])))
        else:
            best, _ = best_plan(cands)
        return _relabel(best, self.name, proven=all(p.proven for p, _ in cands))
