"""Task graphs (DAGs) on embedded boards: the robotics generalisation of the workload.

A DNN model is a chain of layers and stays one (:mod:`sim.workload`; the
training evaluators never see a DAG, so they keep their speed). A robotics
pipeline is a :class:`TaskGraph`: tasks with the work of one invocation (FLOPs,
bytes moved, kernel launches, op class) and edges carrying the bytes one task
hands to the next. It runs periodically: a frame is released every
``period_s`` and must finish within ``deadline_s`` of its release.

:func:`dag_costs` prices a graph on a board in one power mode with the same
formula as a DNN layer (:func:`sim.costmodel.roofline_s`), giving the arrays
every DAG scheduler works on (:class:`DagCosts`): time of each task on each
unit (``inf`` where the unit cannot run it or is offline), transfer time of
each edge when its ends sit on different units, and the extra power of each
unit when busy. Schedulers return a :class:`DagPlan`; its energy per frame is

    E = period_s * P_idle(mode) + sum over tasks of time * (P_active - P_idle)(unit, mode).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from hardware_profiles.board import Board
from sim.costmodel import layer_work, roofline_s
from sim.plan import PlanKind
from sim.workload import OP_CLASSES, Model


def topological_order(succs: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's algorithm, smallest index first among ready nodes (deterministic).
    Shorter than ``len(succs)`` when the graph has a cycle."""
    indeg = [0] * len(succs)
    for s in succs:
        for j in s:
            indeg[j] += 1
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return order


@dataclass(frozen=True)
class Task:
    """One invocation of a task per frame.

    Attributes:
        name: unique within its graph.
        op: op class (selects the unit's efficiency; some units support only some).
        flops: floating-point operations of one invocation.
        nbytes: bytes moved to and from memory by one invocation.
        kernels: kernel launches (op dispatches) of one invocation.
        kernel: name of the measured robotics kernel it runs (sim.robotics.kernels), if any.
        size: that kernel's parallel size (particles, rays, points).
        scale: (unit kind, factor) pairs: the time on units of that kind is the cost
            model's times the factor (a measured/predicted calibration ratio).
    """

    name: str
    op: str
    flops: float
    nbytes: float
    kernels: int = 1
    kernel: str | None = None
    size: int | None = None
    scale: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if any(not f > 0 for _, f in self.scale):
            raise ValueError(f"task {self.name!r}: scale factors must be > 0")
        if self.op not in OP_CLASSES:
            raise ValueError(f"task {self.name!r}: unknown op class {self.op!r}")
        if self.flops < 0 or self.nbytes < 0 or self.kernels < 0:
            raise ValueError(f"task {self.name!r}: flops, nbytes and kernels must be >= 0")


@dataclass(frozen=True)
class Edge:
    """``src`` hands ``nbytes`` to ``dst`` every frame; ``dst`` waits for it."""

    src: str
    dst: str
    nbytes: float = 0.0


@dataclass(frozen=True)
class TaskGraph:
    """A DAG of tasks. Validated on construction: unique names, known ends, no cycle."""

    name: str
    tasks: tuple[Task, ...]
    edges: tuple[Edge, ...] = ()
    index: dict[str, int] = field(init=False, repr=False, compare=False)
    topo: tuple[int, ...] = field(init=False, repr=False, compare=False)
    preds: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    succs: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"graph {self.name!r} has no tasks")
        index = {t.name: i for i, t in enumerate(self.tasks)}
        if len(index) != len(self.tasks):
            raise ValueError(f"graph {self.name!r}: duplicate task names")
        preds: list[list[int]] = [[] for _ in self.tasks]
        succs: list[list[int]] = [[] for _ in self.tasks]
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in index:
                    raise ValueError(f"graph {self.name!r}: edge names unknown task {end!r}")
            if e.nbytes < 0:
                raise ValueError(f"graph {self.name!r}: edge {e.src}->{e.dst} has negative bytes")
            preds[index[e.dst]].append(index[e.src])
            succs[index[e.src]].append(index[e.dst])
        order = topological_order(succs)
        if len(order) != len(self.tasks):
            raise ValueError(f"graph {self.name!r} has a cycle")
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "topo", tuple(order))
        object.__setattr__(self, "preds", tuple(tuple(p) for p in preds))
        object.__setattr__(self, "succs", tuple(tuple(s) for s in succs))

    def __len__(self) -> int:
        return len(self.tasks)

    @classmethod
    def from_model(cls, model: Model, batch: int = 1, dtype: str = "fp32") -> TaskGraph:
        """The forward pass of a DNN (inference on ``batch`` samples) as a chain of tasks."""
        tasks, edges = [], []
        for i, ly in enumerate(model.layers):
            flops, kernels, nbytes = layer_work(ly, "fwd", batch, dtype, model.input_bytes_of(i))
            tasks.append(Task(ly.name, ly.op, flops, nbytes, kernels))
            if i:
                edges.append(Edge(model.layers[i - 1].name, ly.name,
                                  model.layers[i - 1].activation_bytes * batch))
        return cls(model.name, tuple(tasks), tuple(edges))


@dataclass(frozen=True)
class DagProblem:
    """A periodic pipeline on a board: what every DAG scheduler reads.

    Attributes:
        graph: the task graph of one frame.
        board: the platform.
        period_s: a frame is released every ``period_s`` (1 / frame rate).
        deadline_s: each frame must finish within this of its release.
        modes: power modes the scheduler may choose from (empty: all of the board's).
        dtype: precision of the work (DLAs run fp16/int8 only; their fp32 entry says so).
        time_scale: [board unit] the factor a scheduler prices execution times at, for
            the slowdowns the frames DES applies (load, jitter;
            :func:`sim.des.frames.planning_scale`); empty: 1 on every unit. Only
            :func:`planning_costs` applies it: the DES and a plan's own figures use
            the nominal times (:func:`dag_costs`).
    """

    graph: TaskGraph
    board: Board
    period_s: float
    deadline_s: float
    modes: tuple[str, ...] = ()
    dtype: str = "fp32"
    time_scale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.period_s > 0 or not self.deadline_s > 0:
            raise ValueError("period_s and deadline_s must be > 0")
        if self.time_scale and (len(self.time_scale) != len(self.board.units)
                                or not all(math.isfinite(f) and f >= 1.0 for f in self.time_scale)):
            raise ValueError("time_scale needs one finite factor >= 1 per board unit")
        for m in self.modes:
            if m not in self.board.power_modes:
                raise ValueError(f"unknown power mode {m!r} of board {self.board.name!r}")

    @property
    def allowed_modes(self) -> tuple[str, ...]:
        return self.modes or tuple(self.board.power_modes)


@dataclass(frozen=True)
class DagCosts:
    """One problem in one power mode, as arrays (what the schedulers work on).

    Attributes:
        tasks, units: names, in graph and board order.
        time_s: [task, unit] seconds of one invocation; ``inf`` = cannot run there.
        edges: (src, dst) task indices.
        comm_s: [edge] transfer seconds when src and dst run on different units (0 on one unit).
        busy_w: [unit] extra watts while the unit runs a task (active - idle).
        idle_w: board watts with every online unit idle.
        period_s, deadline_s: as in the problem.
        mode: the power mode ("" for hand-written tables).
        mem_s: [task, unit] memory-bound seconds (bytes / the unit's bandwidth), or None.
        nbytes: [task] bytes one execution moves, or None.
        mem_bw_Bps: the board's shared memory bandwidth in this mode (inf: unknown).
    """

    tasks: tuple[str, ...]
    units: tuple[str, ...]
    time_s: np.ndarray
    edges: tuple[tuple[int, int], ...]
    comm_s: np.ndarray
    busy_w: np.ndarray
    idle_w: float
    period_s: float
    deadline_s: float
    mode: str = ""
    mem_s: np.ndarray | None = None
    nbytes: np.ndarray | None = None
    mem_bw_Bps: float = math.inf
    preds: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False, compare=False)
    succs: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n, u = len(self.tasks), len(self.units)
        if self.time_s.shape != (n, u) or self.busy_w.shape != (u,) or self.comm_s.shape != (len(self.edges),):
            raise ValueError("DagCosts: array shapes do not match tasks, units and edges")
        if np.any(np.isinf(self.time_s).all(axis=1)):
            bad = self.tasks[int(np.flatnonzero(np.isinf(self.time_s).all(axis=1))[0])]
            raise ValueError(f"task {bad!r} can run on no online unit")
        preds: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        succs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for k, (a, b) in enumerate(self.edges):
            preds[b].append((a, k))
            succs[a].append((b, k))
        object.__setattr__(self, "preds", tuple(tuple(p) for p in preds))
        object.__setattr__(self, "succs", tuple(tuple(s) for s in succs))

    @classmethod
    def from_tables(cls, time_s: Sequence[Sequence[float]], edges: dict[tuple[int, int], float],
                    busy_w: Sequence[float] | None = None, idle_w: float = 0.0,
                    period_s: float = math.inf, deadline_s: float = math.inf) -> DagCosts:
        """Hand-written instances (textbook examples, tests): tasks t0.., units u0.."""
        t = np.asarray(time_s, dtype=float)
        keys = tuple(edges)
        return cls(tuple(f"t{i}" for i in range(t.shape[0])), tuple(f"u{j}" for j in range(t.shape[1])),
                   t, keys, np.array([edges[k] for k in keys], dtype=float),
                   np.zeros(t.shape[1]) if busy_w is None else np.asarray(busy_w, dtype=float),
                   idle_w, period_s, deadline_s)

    def topo(self) -> list[int]:
        """A topological order (smallest index first among ready tasks)."""
        return topological_order([[j for j, _ in s] for s in self.succs])


def planning_costs(problem: DagProblem, mode: str) -> DagCosts:
    """What a scheduler plans with: :func:`dag_costs` with each unit's execution times
    scaled by ``problem.time_scale`` (the slowdowns the DES will apply)."""
    c = dag_costs(problem, mode)
    if not problem.time_scale:
        return c
    return dataclasses.replace(c, time_s=c.time_s * np.asarray(problem.time_scale, dtype=float))


def compact_schedule(c: DagCosts, unit: Sequence[int], start: Sequence[float]) -> DagPlan:
    """``unit``'s assignment and each unit's order of tasks (by ``start``, ties in a
    topological order), every task started as early as ``c``'s times allow."""
    topo_pos = {i: r for r, i in enumerate(c.topo())}
    fin = np.zeros(len(unit))
    st = np.zeros(len(unit))
    free = np.zeros(len(c.units))
    # A predecessor starts no later than its successor (ties broken by a topological
    # order), so this order is topological and keeps each unit's order.
    for i in sorted(range(len(unit)), key=lambda i: (start[i], topo_pos[i])):
        u = unit[i]
        ready = max((fin[p] + (c.comm_s[k] if unit[p] != u else 0.0) for p, k in c.preds[i]), default=0.0)
        st[i] = max(ready, free[u])
        fin[i] = st[i] + c.time_s[i, u]
        free[u] = fin[i]
    return DagPlan(c.mode, tuple(unit), tuple(float(v) for v in st))


def dag_costs(problem: DagProblem, mode: str) -> DagCosts:
    """Price ``problem`` in power ``mode`` of its board (nominal times: ``time_scale``
    is :func:`planning_costs`'s)."""
    board, g = problem.board, problem.graph
    units = tuple(board.units)
    t = np.full((len(g), len(units)), math.inf)
    mem = np.full((len(g), len(units)), math.inf)
    for j, u in enumerate(units):
        if board.power_modes[mode].units[u].speed <= 0:
            continue
        dev = board.unit_profile(u, mode)
        for i, task in enumerate(g.tasks):
            if board.supports(u, task.op):
                eff = dev.mem_eff(task.op, task.nbytes)
                f = dict(task.scale).get(dev.kind, 1.0)
                t[i, j] = f * roofline_s(dev, task.op, task.flops, task.nbytes, task.kernels, problem.dtype,
                                         eff)
                mem[i, j] = task.nbytes / (dev.mem_bw_Bps * eff)
    edges = tuple((g.index[e.src], g.index[e.dst]) for e in g.edges)
    comm = np.array([board.transfer_s(e.nbytes, mode) for e in g.edges], dtype=float)
    pm = board.power_modes[mode]
    busy = np.array([pm.units[u].active_w - board.unit_idle_w(u, mode) if pm.units[u].speed > 0 else 0.0
                     for u in units])
    return DagCosts(tuple(t.name for t in g.tasks), units, t, edges, comm, busy, board.idle_w(mode),
                    problem.period_s, problem.deadline_s, mode, mem,
                    np.array([task.nbytes for task in g.tasks], dtype=float),
                    board.mem_bw_Bps * board.power_modes[mode].mem_bw_scale)


@dataclass(frozen=True)
class DagPlan:
    """A static schedule of one frame: each task's unit and start time, in one power mode.

    Attributes:
        kind: always :attr:`PlanKind.DAG <sim.plan.PlanKind.DAG>` (evaluators dispatch on it).
        mode: power mode.
        unit: [task] unit index.
        start_s: [task] start time relative to the frame's release.
        scheduler: name of the scheduler that made it.
        proven: for exact schedulers, whether optimality was proven.
    """

    kind: ClassVar[PlanKind] = PlanKind.DAG
    mode: str
    unit: tuple[int, ...]
    start_s: tuple[float, ...]
    scheduler: str = ""
    proven: bool = False

    def finish_s(self, c: DagCosts) -> np.ndarray:
        return np.asarray(self.start_s) + c.time_s[np.arange(len(self.unit)), list(self.unit)]

    def makespan_s(self, c: DagCosts) -> float:
        return float(self.finish_s(c).max())

    def unit_busy_s(self, c: DagCosts) -> np.ndarray:
        """[unit] busy seconds per frame."""
        busy = np.zeros(len(c.units))
        np.add.at(busy, list(self.unit), c.time_s[np.arange(len(self.unit)), list(self.unit)])
        return busy

    def energy_j(self, c: DagCosts) -> float:
        """Energy of one period: idle board power for the period plus busy extra power."""
        return float(c.idle_w * c.period_s + (self.unit_busy_s(c) * c.busy_w).sum())

    def feasible(self, c: DagCosts, tol: float = 1e-9) -> bool:
        """Meets the deadline, and no unit is busier than one period (the pipeline keeps up)."""
        return bool(self.makespan_s(c) <= c.deadline_s * (1 + tol)
                    and (self.unit_busy_s(c) <= c.period_s * (1 + tol)).all())

    def check(self, c: DagCosts, tol: float = 1e-9) -> None:
        """Raise ValueError unless the schedule is valid: runnable units, precedence with
        transfers respected, no two tasks overlapping on one unit."""
        st, fin = np.asarray(self.start_s), self.finish_s(c)
        if not np.isfinite(fin).all() or (st < -tol).any():
            raise ValueError("a task is placed on a unit that cannot run it, or starts before 0")
        for k, (a, b) in enumerate(c.edges):
            ready = fin[a] + (c.comm_s[k] if self.unit[a] != self.unit[b] else 0.0)
            if st[b] < ready - tol * max(1.0, ready):
                raise ValueError(f"{c.tasks[b]} starts before {c.tasks[a]}'s output arrives")
        for u in set(self.unit):
            idx = sorted((i for i, x in enumerate(self.unit) if x == u), key=lambda i: st[i])
            for p, q in zip(idx, idx[1:]):
                if st[q] < fin[p] - tol * max(1.0, fin[p]):
                    raise ValueError(f"{c.tasks[p]} and {c.tasks[q]} overlap on {c.units[u]}")

    def to_dict(self, c: DagCosts) -> dict[str, Any]:
        fin = self.finish_s(c)
        return {"kind": self.kind.value, "scheduler": self.scheduler, "mode": self.mode, "proven": self.proven,
                "makespan_s": self.makespan_s(c), "energy_j_per_frame": self.energy_j(c),
                "tasks": [{"task": c.tasks[i], "unit": c.units[u], "start_s": float(self.start_s[i]),
                           "finish_s": float(fin[i])} for i, u in enumerate(self.unit)]}
