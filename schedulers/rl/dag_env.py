"""`hetsim/DagSchedule-v0`: one frame of a task DAG on an embedded board, as a gymnasium environment.

The `rl-dag` scheduler list-schedules a :class:`sim.dag.DagCosts` instance (one
power mode) the way the `heft` and `energy` heuristics do: tasks in HEFT's
upward-rank order (:func:`schedulers.dag.rank_order`), each at its earliest
start with insertion into idle gaps (:func:`schedulers.dag.list_schedule`).
Only the choice of unit per task is the policy's. :class:`DagInstance` holds
the per-instance facts (order, ranks, reference schedule, static features),
:class:`DagEpisode` one schedule in progress; :class:`DagScheduleEnv` wraps
them as a ``gymnasium.Env`` (the plumbing shared with the placement
environment: schedulers/rl/masked_env.py). The scheduler
(schedulers/rl/dag_scheduler.py) drives episodes directly, several at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from hardware_profiles.board import Board, list_boards, load_board
from hardware_profiles.errors import HetsimError
from schedulers.dag import (
    energy_schedule,
    heft_schedule,
    list_schedule,
    rank_order,
    tails,
    upward_rank,
)
from schedulers.rl.masked_env import MaskedSlotEnv, log_ratio, observation_vector, padded_mask
from sim.dag import DagCosts, DagPlan, DagProblem, dag_costs
from sim.instances import random_graph

#: Unit slots of the observation and the action space; boards with more units are refused.
MAX_UNITS = 8
#: A missed deadline or period costs ``MISS_BASE + MISS_SCALE * min(miss, MISS_CLIP)`` on top of
#: the energy term, ``miss`` being the relative overrun of makespan and busiest unit's load:
#: every feasible schedule of an instance is rewarded above every infeasible one within reason
#: (energy ratios stay well under 1 + MISS_BASE), and a smaller miss is still better.
MISS_BASE = 1.0
MISS_SCALE = 4.0
MISS_CLIP = 2.0
#: Training distribution (the issue's): tasks per graph, deadline as a factor of HEFT's
#: makespan in the board's first (fastest) mode, period as a factor of the deadline.
TASKS = (6, 20)
DEADLINE_FACTOR = (0.9, 3.0)
PERIOD_FACTOR = (1.0, 2.0)

CTX_FEATURES = 19
UNIT_FEATURES = 16


def slot_layout(max_units: int = MAX_UNITS) -> tuple[int, int, int]:
    """The observation's layout for :class:`schedulers.rl.policy.SlotPolicy`: the context,
    then one block per unit slot."""
    return CTX_FEATURES, CTX_FEATURES, UNIT_FEATURES


def obs_size(max_units: int = MAX_UNITS) -> int:
    """Length of the observation vector: the context, then one block per unit slot."""
    return MaskedSlotEnv.obs_length(slot_layout(max_units), max_units)


def frame_energy_j(plan: DagPlan, c: DagCosts) -> float:
    """``plan.energy_j(c)``, with the idle term left out when the period is unbounded
    (hand-written tables): a constant of the instance, and inf * 0 is nan."""
    busy = float((plan.unit_busy_s(c) * c.busy_w).sum())
    return busy + (c.idle_w * c.period_s if math.isfinite(c.period_s) else 0.0)


def miss(plan: DagPlan, c: DagCosts) -> float:
    """Relative overrun of the deadline plus that of the period by the busiest unit (0: feasible)."""
    over = 0.0
    if math.isfinite(c.deadline_s):
        over += max(0.0, plan.makespan_s(c) / c.deadline_s - 1.0)
    if math.isfinite(c.period_s):
        over += max(0.0, float(plan.unit_busy_s(c).max()) / c.period_s - 1.0)
    return over


def replay(c: DagCosts, units: Sequence[int], order: Sequence[int] | None = None,
           scheduler: str = "rl-dag") -> DagPlan:
    """The list schedule (rank order, earliest start with insertion) of ``units[task]``."""
    return list_schedule(c, rank_order(c) if order is None else order, lambda i, opts, load: int(units[i]),
                         scheduler)


@lru_cache(maxsize=1)
def training_boards() -> tuple[Board, ...]:
    """The shipped boards with a choice to make (more than one unit), in name order."""
    return tuple(b for b in (load_board(n) for n in sorted(list_boards())) if len(b.units) > 1)


def draw_problem(seed: int) -> DagProblem:
    """A training instance: a random graph of 6-20 tasks on a shipped board, its deadline a
    random factor (0.9-3) of HEFT's makespan in the board's first mode, its period 1-2 x
    the deadline. Same seed, same problem."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    boards = training_boards()
    board = boards[int(rng.integers(len(boards)))]
    g = random_graph(seed, int(rng.integers(TASKS[0], TASKS[1] + 1)))
    c0 = dag_costs(DagProblem(g, board, 1.0, 1.0), next(iter(board.power_modes)))
    hm = heft_schedule(c0).makespan_s(c0)
    deadline = float(rng.uniform(*DEADLINE_FACTOR)) * hm
    return DagProblem(g, board, period_s=float(rng.uniform(*PERIOD_FACTOR)) * deadline, deadline_s=deadline)


def draw_costs(seed: int) -> DagCosts:
    """:func:`draw_problem` priced in one of its board's power modes (drawn from the same seed)."""
    pr = draw_problem(seed)
    modes = pr.allowed_modes
    mode = modes[int(np.random.default_rng(np.random.SeedSequence([seed, 1])).integers(len(modes)))]
    return dag_costs(pr, mode)


@dataclass
class Reference:
    """The energy heuristic's schedule in the same mode: the reward's scale.

    ``energy_schedule`` unless only HEFT's schedule meets deadline and period
    (the `energy` scheduler keeps both as candidates).
    """

    plan: DagPlan
    energy_j: float
    busy_j: float
    feasible: bool
    heft_makespan_s: float

    @classmethod
    def of(cls, c: DagCosts) -> Reference:
        ea, hf = energy_schedule(c), heft_schedule(c)
        plan = hf if not ea.feasible(c) and hf.feasible(c) else ea
        e = frame_energy_j(plan, c)
        busy = float((plan.unit_busy_s(c) * c.busy_w).sum())
        return cls(plan, e, busy, plan.feasible(c), hf.makespan_s(c))


class DagInstance:
    """Per-instance facts every episode on ``c`` reads (computed once).

    With ``prune`` the action mask also drops units that would make the frame
    miss for certain (:meth:`DagEpisode.action_mask`).
    """

    def __init__(self, c: DagCosts, max_units: int = MAX_UNITS, prune: bool = True) -> None:
        n, nu = c.time_s.shape
        if nu > max_units:
            raise HetsimError(f"rl-dag: the board has {nu} units; the policy handles at most {max_units}")
        self.c, self.max_units, self.n, self.prune = c, max_units, n, prune
        self.order = rank_order(c)
        self.pos = np.empty(n, dtype=int)
        self.pos[self.order] = np.arange(n)
        self.ref = Reference.of(c)
        # time scales of the features: deadline and period when bounded, else HEFT's frame
        self.d_s = c.deadline_s if math.isfinite(c.deadline_s) else max(self.ref.heft_makespan_s, 1e-12)
        self.p_s = c.period_s if math.isfinite(c.period_s) else max(self.d_s, 1e-12)
        self.e_ref = max(self.ref.energy_j, 1e-12)
        self.b_ref = max(self.ref.busy_j, 1e-12 * self.e_ref, 1e-15)
        t = c.time_s
        self.runnable = np.isfinite(t)
        self.fastest = t.min(axis=1)
        with np.errstate(invalid="ignore"):
            self.task_e = np.where(self.runnable, t * c.busy_w[None, :], np.inf)      # [task, unit] busy J
        self.min_e = self.task_e.min(axis=1)
        self.rank = upward_rank(c)
        self.tail = tails(c)
        self.lft = self.d_s - self.tail          # latest finish that can still meet the deadline
        # the same for pruning, where an unbounded deadline prunes nothing
        self.lft_prune = c.deadline_s - self.tail
        self.comm_in = np.zeros(n)
        self.comm_out = np.zeros(n)
        for k, (a, b) in enumerate(c.edges):
            self.comm_out[a] += c.comm_s[k]
            self.comm_in[b] += c.comm_s[k]
        # suffix sums over the rank order (position p: tasks at positions >= p)
        o = self.order
        ratio = np.where(self.runnable, log_ratio(t, self.fastest[:, None]), 0.0)[o]
        self.after_runnable = np.vstack([np.cumsum(self.runnable[o][::-1], axis=0)[::-1], np.zeros((1, nu))])
        self.after_ratio = np.vstack([np.cumsum(ratio[::-1], axis=0)[::-1], np.zeros((1, nu))])
        self.after_min_e = np.append(np.cumsum(self.min_e[o][::-1])[::-1], 0.0)
        self.after_fastest = np.append(np.cumsum(self.fastest[o][::-1])[::-1], 0.0)
        self.present = self.runnable.any(axis=0)
        bw = float(c.busy_w.max()) if c.busy_w.size else 0.0
        self.busy_w_rel = c.busy_w / bw if bw > 0 else np.zeros(nu)
        self.ctx_static = np.array([
            n / 20.0, self.d_s / self.p_s, self.ref.heft_makespan_s / self.d_s,
            c.idle_w * c.period_s / self.e_ref if math.isfinite(c.period_s) else 0.0,
            1.0 if self.ref.feasible else 0.0])

    @property
    def slots(self) -> int:
        """Unit slots of the policy this instance is built for."""
        return self.max_units


class DagEpisode:
    """One schedule in progress: the first ``k`` tasks of the rank order have units.

    The state is replayed through :func:`schedulers.dag.list_schedule` after
    every step (its ``choose`` returns the units chosen so far and, at the next
    task, records the options it offers): the environment places tasks exactly
    as the heuristics do, at O(n) list-scheduling steps per step.
    """

    def __init__(self, inst: DagInstance) -> None:
        self.inst = inst
        self.actions: list[int] = []
        self.plan: DagPlan | None = None
        self._replay()

    @property
    def done(self) -> bool:
        return len(self.actions) >= self.inst.n

    @property
    def task(self) -> int:
        """The task to place next (the last one once done)."""
        return self.inst.order[min(len(self.actions), self.inst.n - 1)]

    def key(self) -> bytes:
        """The state's identity: the units chosen so far."""
        return bytes(self.actions)

    def _replay(self) -> None:
        inst, k = self.inst, len(self.actions)
        opts: list[tuple[int, float, float]] = []
        load = np.zeros(len(inst.c.units))

        def choose(i: int, options: list[tuple[int, float, float]], loads: np.ndarray) -> int:
            p = int(inst.pos[i])
            if p < k:
                return self.actions[p]
            opts.extend(options)
            load[:] = loads
            return options[0][0]      # placeholder: the next task is not part of the state

        order = inst.order[: k + 1]
        plan = list_schedule(inst.c, order, choose, "rl-dag")
        if k >= inst.n:
            self.plan = plan
        placed = np.array(inst.order[:k], dtype=int)
        self.unit = np.asarray(plan.unit)
        self.finish = np.asarray(plan.start_s) + inst.c.time_s[np.arange(inst.n), np.maximum(self.unit, 0)]
        self.placed = placed
        self.opts = opts
        self.load = load if k < inst.n else plan.unit_busy_s(inst.c)

    def action_mask(self) -> np.ndarray:
        """Unit slots that can run the current task (padding and offline units never can).

        With pruning (the default), of those only the units on which the frame can
        still meet deadline and period, when there are any: a task finishing after
        its latest finish time (deadline minus :func:`schedulers.dag.tails`, a lower
        bound on the time after it) makes the makespan exceed the deadline, and a
        unit's load per frame only grows. Pruning thus never removes a schedule that
        meets both; where none is left every runnable unit stays valid (the frame
        misses anyway, and the reward grades by how much).
        """
        inst, i = self.inst, self.task
        ok = inst.runnable[i]
        if inst.prune and not self.done:
            fin = np.full(ok.size, np.inf)
            for u, _, f in self.opts:
                fin[u] = f
            with np.errstate(invalid="ignore"):
                safe = ok & (fin <= inst.lft_prune[i] + 1e-9 * abs(inst.lft_prune[i]))
                safe &= self.load + inst.c.time_s[i] <= inst.c.period_s * (1 + 1e-9)
            if safe.any():
                ok = safe
        return padded_mask(ok, inst.max_units)

    def step(self, unit: int) -> None:
        """Put the current task on ``unit`` (the caller checks it against the mask)."""
        self.actions.append(int(unit))
        self._replay()

    def observation(self) -> np.ndarray:
        inst, c = self.inst, self.inst.c
        k, i, nu = len(self.actions), self.task, c.time_s.shape[1]
        D, P = inst.d_s, inst.p_s
        placed = self.placed
        fin_placed = self.finish[placed]
        pu = self.unit[placed]
        free = np.zeros(nu)
        np.maximum.at(free, pu, fin_placed)
        start = np.full(nu, np.inf)
        finish = np.full(nu, np.inf)
        for u, s, f in self.opts:
            start[u], finish[u] = s, f
        ok = inst.runnable[i]
        min_fin = float(finish[ok].min()) if ok.any() else D
        busy_so_far = float((self.load * c.busy_w).sum())
        ctx = np.concatenate([[
            k / inst.n, inst.rank[i] / max(inst.rank[inst.order[0]], 1e-12), inst.tail[i] / D, inst.lft[i] / D,
            min_fin / D, (inst.lft[i] - min_fin) / D, inst.comm_in[i] / D, inst.comm_out[i] / D,
            len(c.preds[i]) / 3.0, len(c.succs[i]) / 3.0,
            (float(fin_placed.max()) if k else 0.0) / D, busy_so_far / inst.b_ref,
            inst.after_min_e[k] / inst.b_ref, inst.after_fastest[k] / D], inst.ctx_static])
        rest = max(inst.n - k - 1, 1)
        pred_units = [int(self.unit[p]) for p, _ in c.preds[i]]
        per = np.zeros((inst.max_units, UNIT_FEATURES))
        e_i = inst.task_e[i]
        per[:nu, 0] = inst.present
        per[:nu, 1] = ok
        per[:nu, 2] = log_ratio(c.time_s[i], inst.fastest[i])
        per[:nu, 3] = np.where(ok, c.time_s[i] / D, 10.0)
        per[:nu, 4] = np.where(ok, e_i / inst.b_ref, 10.0)
        per[:nu, 5] = np.where(ok, (e_i - inst.min_e[i]) / inst.b_ref, 10.0)
        per[:nu, 6] = np.where(ok, start / D, 10.0)
        per[:nu, 7] = np.where(ok, finish / D, 10.0)
        per[:nu, 8] = np.where(ok, (inst.lft[i] - finish) / D, -10.0)
        per[:nu, 9] = free / D
        per[:nu, 10] = self.load / P
        per[:nu, 11] = np.where(ok, (self.load + c.time_s[i]) / P, 10.0)
        per[:nu, 12] = inst.busy_w_rel
        per[:nu, 13] = inst.after_runnable[k + 1] / rest
        per[:nu, 14] = inst.after_ratio[k + 1] / np.maximum(inst.after_runnable[k + 1], 1.0)
        per[:nu, 15] = np.bincount(pred_units, minlength=nu)[:nu] / max(len(pred_units), 1)
        return observation_vector([ctx, per.ravel()], finite=True)

    def outcome(self) -> dict[str, Any]:
        """The finished schedule's reward and facts (module constants say how the reward is made)."""
        assert self.plan is not None, "episode not finished"
        inst, c, plan = self.inst, self.inst.c, self.plan
        e = frame_energy_j(plan, c)
        over = miss(plan, c)
        reward = -e / inst.e_ref - (MISS_BASE + MISS_SCALE * min(over, MISS_CLIP) if over > 0 else 0.0)
        return {"reward": float(reward), "energy_j": e, "energy_ratio": e / inst.e_ref,
                "feasible": over == 0.0, "miss": over, "makespan_s": plan.makespan_s(c),
                "reference_feasible": inst.ref.feasible}


class DagScheduleEnv(MaskedSlotEnv[DagInstance, DagEpisode]):
    """Schedule one frame of a task DAG on a board in a fixed power mode.

    ## Description
    An instance is a :class:`sim.dag.DagCosts` (a periodic task graph priced
    on an embedded board in one power mode: seconds of each task on each
    unit, transfer seconds of each edge crossing units, busy watts per unit,
    deadline and period). The tasks are taken one per step in HEFT's
    upward-rank order; the action puts the current task on a unit, where it
    starts as early as its inputs and the unit's idle gaps allow (insertion),
    exactly as :func:`schedulers.dag.list_schedule` places it. Given ``costs``
    every episode is that instance; given ``pool`` each reset picks one of it;
    otherwise each reset draws a training instance (:func:`draw_costs`) with a
    seed from ``self.np_random`` below ``TRAIN_SEED_LIMIT``: a random graph of
    6-20 tasks on a shipped board with more than one unit, in a random power
    mode, deadline 0.9-3 x HEFT's makespan in the board's fastest mode,
    period 1-2 x the deadline.

    ## Action Space
    ``Discrete(max_units)``: a unit index in board order. ``action_masks()``
    marks the units that can run the current task (finite time: the unit
    supports its op class and is online in the mode); padding slots never.
    With ``prune`` (default) it keeps, of those, the units on which the frame
    can still meet deadline and period when there are any: the task's earliest
    finish there is within its latest finish time (deadline minus the fastest
    path after it) and the unit's load stays within the period. An action
    outside the mask is replaced by the first valid unit (``info`` says so).

    ## Observation Space
    ``Box(-10, 10, (19 + 16 * max_units,), float32)``, times relative to the
    deadline D (HEFT's makespan when unbounded), loads to the period P,
    energies to the reference schedule's busy energy. Context (19): progress
    k/n, n/20; the current task's upward rank relative to the first task's,
    its tail (fastest path after it) and latest finish time D - tail, its
    earliest finish over units and the slack left to its latest finish,
    transfer seconds of its inputs and outputs (bytes in/out), predecessor
    and successor counts; the makespan and busy energy so far, the least busy
    energy and fastest work of the tasks not yet placed; D/P, HEFT's makespan
    in this mode / D, the idle share of the reference energy, whether the
    reference meets deadline and period. Per unit slot (16): online, can run
    the task, log(time / fastest time of the task), time / D, busy energy of
    the task there and its excess over the task's cheapest unit, earliest
    start and finish there / D, slack of that finish to the latest finish,
    the unit's free time / D (end of its last task), its load / P before and
    after taking the task, busy watts / the board's largest, the share of the
    later tasks it can run and their mean log time ratio there, the share of
    the task's predecessors on it. Padding slots are zero.

    ## Rewards
    0 until the last task; then ``-E / E_ref`` where E is the frame's energy
    (idle board power for the period plus busy power of every task) and E_ref
    that of the energy heuristic's schedule in the same mode (0 gap: -1),
    minus ``1 + 4 * min(miss, 2)`` when the schedule misses, ``miss`` being
    the relative overrun of the deadline by the makespan plus that of the
    period by the busiest unit's load.

    ## Episode End
    Terminates after the last task; never truncates. ``info`` of the last step
    holds ``energy_j``, ``energy_ratio``, ``feasible``, ``miss``,
    ``makespan_s``, ``reference_feasible`` and the ``units`` chosen per task.
    """

    instance_kind = "DagInstance"
    slots_param = "max_units"

    def __init__(self, costs: DagCosts | None = None, max_units: int = MAX_UNITS,
                 pool: Sequence[DagInstance] | None = None, prune: bool = True) -> None:
        self.max_units, self.prune = max_units, prune
        fixed = DagInstance(costs, max_units, prune) if costs is not None else None
        super().__init__(max_units, slot_layout(max_units), fixed, pool)

    def draw_instance(self) -> DagInstance:
        return DagInstance(draw_costs(self.training_seed()), self.max_units, self.prune)

    def new_episode(self, inst: DagInstance) -> DagEpisode:
        return DagEpisode(inst)

    def reset_info(self, inst: DagInstance) -> dict[str, Any]:
        return {"tasks": inst.n, "units": len(inst.c.units), "mode": inst.c.mode}

    def final_info(self, ep: DagEpisode) -> dict[str, Any]:
        assert ep.plan is not None
        return {"units": ep.plan.unit}
