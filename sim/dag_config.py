"""Robotics experiment configs (``hetsim dag``): a board, a periodic pipeline, a scheduler.

Example (experiments/configs/robotics/orin_slam.yaml)::

    name: orin-slam
    board: agx-orin-32              # a board name, or a path to a board JSON
    pipeline:                       # a built-in pipeline and its parameters ...
      name: perception_slam
      params: {particles: 100000, cameras: 2}
    # pipeline: {file: my_dag.yaml} # ... or a task-graph file (format below)
    frame_rate_hz: 30
    deadline_ms: 25                 # default: one period
    modes: [40w, 30w]               # power modes allowed (default: all)
    miss_tolerance: 0.01            # share of frames the DES may miss (default 0.01)
    plan_with_des_effects: true     # schedulers price the DES's load and jitter (default)
    scheduler: {name: energy, params: {margin: 0.1}}
    des:                            # the frames DES (sim/des/frames.py)
      frames: 1000
      jitter_cv: 0.1
      release_jitter_ms: 0.5
      memory_contention: true
      load: [{pattern: periodic, workers: all, period_s: 1.0, duty: 0.2,
              until_s: 60, slowdown: 1.5, random_phase: true}]
    seed: 0

A task-graph file::

    name: my-dag
    tasks:
      - {name: detect, op: conv, flops: 3.6e9, bytes: 8.0e7, kernels: 60}
      - {name: track, op: elementwise, flops: 1.0e5, bytes: 4.0e5}
    edges:
      - {src: detect, dst: track, bytes: 512}

Every fault is a one-line :class:`~hardware_profiles.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from hardware_profiles.board import Board, load_board
from hardware_profiles.errors import ConfigError
from sim.config import (
    PeriodicPattern,
    RandomWalkPattern,
    SchedulerConfig,
    StepsPattern,
    _Strict,
    read_yaml,
)
from sim.config import validation_error as _validation_error
from sim.dag import DagProblem, Edge, Task, TaskGraph
from sim.des.frames import FrameOptions, planning_scale
from sim.robotics.pipelines import PIPELINES


class PipelineConfig(_Strict):
    name: str | None = Field(None, description="a built-in pipeline (sim.robotics.pipelines.PIPELINES)")
    params: dict[str, Any] = Field(default_factory=dict, description="its keyword arguments")
    file: str | None = Field(None, description="a task-graph YAML file, relative to the config")


class DesConfig(_Strict):
    frames: int = Field(200, gt=0, description="frames to simulate")
    jitter_cv: float = Field(0.0, ge=0, description="coefficient of variation of execution times")
    release_jitter_ms: float = Field(0.0, ge=0, description="each release delayed by U[0, this)")
    memory_contention: bool = Field(False, description="stretch memory-bound work on a shared-bandwidth overload")
    load: list[StepsPattern | RandomWalkPattern | PeriodicPattern] = Field(
        default_factory=list, description="background-load status patterns over units (sim.dynamics)")


class DagConfig(_Strict):
    name: str = "robotics"
    seed: int = Field(0, ge=0)
    board: str = Field(description="board name (hardware_profiles/boards) or a path to a board JSON")
    pipeline: PipelineConfig
    frame_rate_hz: float = Field(gt=0, description="frames released per second")
    deadline_ms: float | None = Field(None, gt=0, description="end-to-end deadline (default: one period)")
    modes: list[str] = Field(default_factory=list, description="power modes allowed (default: all)")
    miss_tolerance: float = Field(0.01, gt=0, lt=1, description="share of frames the DES may miss; "
                                  "hetsim dag flags a plan that misses more")
    plan_with_des_effects: bool = Field(True, description="schedulers price execution times scaled by the "
                                        "DES's load and jitter (sim.des.frames.planning_scale)")
    scheduler: SchedulerConfig = Field(default_factory=lambda: SchedulerConfig(name="energy"))
    des: DesConfig = Field(default_factory=DesConfig)


class _TaskEntry(_Strict):
    name: str
    op: str
    flops: float = Field(ge=0)
    bytes: float = Field(ge=0)
    kernels: int = Field(1, ge=0)


class _EdgeEntry(_Strict):
    src: str
    dst: str
    bytes: float = Field(0.0, ge=0)


class _GraphFile(_Strict):
    name: str = "dag"
    tasks: list[_TaskEntry] = Field(min_length=1)
    edges: list[_EdgeEntry] = Field(default_factory=list)


def load_graph_file(path: str | Path) -> TaskGraph:
    """A task graph from YAML (format in the module docstring)."""
    data = read_yaml(path)
    try:
        g = _GraphFile.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as e:
        raise _validation_error(str(path), e) from None
    try:
        return TaskGraph(g.name, tuple(Task(t.name, t.op, t.flops, t.bytes, t.kernels) for t in g.tasks),
                         tuple(Edge(e.src, e.dst, e.bytes) for e in g.edges))
    except ValueError as e:
        raise ConfigError(str(path), "tasks", str(e)) from None


def is_dag_config(data: Any) -> bool:
    """A mapping is a robotics config (not a training one) when it names a board."""
    return isinstance(data, dict) and "board" in data


def load_dag_config(path: str | Path) -> tuple[DagConfig, DagProblem, FrameOptions]:
    """Read a robotics config: the validated config, its problem and its DES options."""
    return dag_config_from_dict(read_yaml(path), Path(path).resolve().parent, str(path))


def dag_config_from_dict(data: Any, base: Path, source: str) -> tuple[DagConfig, DagProblem, FrameOptions]:
    """A robotics config from a parsed mapping; relative paths start at ``base``."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "a config must be a YAML mapping")
    try:
        cfg = DagConfig.model_validate(data)
    except ValidationError as e:
        raise _validation_error(source, e) from None
    board = _board(cfg, base, source)
    graph = _graph(cfg, base, source)
    period = 1.0 / cfg.frame_rate_hz
    for i, m in enumerate(cfg.modes):
        if m not in board.power_modes:
            raise ConfigError(source, f"modes[{i}]", f"board {board.name!r} has no power mode {m!r} "
                              f"(it has {', '.join(board.power_modes)})")
    d = cfg.des
    opts = FrameOptions(frames=d.frames, jitter_cv=d.jitter_cv, release_jitter_s=d.release_jitter_ms / 1e3,
                        load=tuple(d.load), memory_contention=d.memory_contention, seed=cfg.seed,
                        miss_tolerance=cfg.miss_tolerance)
    scale = planning_scale(opts, len(board.units), period) if cfg.plan_with_des_effects else ()
    problem = DagProblem(graph, board, period, (cfg.deadline_ms / 1e3) if cfg.deadline_ms else period,
                         tuple(cfg.modes), time_scale=scale if any(f != 1.0 for f in scale) else ())
    for t in graph.tasks:
        if not any(board.supports(u, t.op) for u in board.units):
            raise ConfigError(source, "pipeline", f"no unit of {board.name!r} runs op class {t.op!r} "
                              f"(task {t.name!r})")
    return cfg, problem, opts


def _board(cfg: DagConfig, base: Path, source: str) -> Board:
    if cfg.board.endswith(".json"):
        p = Path(cfg.board)
        return load_board(p if p.is_absolute() else base / p)
    try:
        return load_board(cfg.board)
    except ConfigError as e:
        raise ConfigError(source, "board", e.message) from None


def _graph(cfg: DagConfig, base: Path, source: str) -> TaskGraph:
    pc = cfg.pipeline
    if (pc.name is None) == (pc.file is None):
        raise ConfigError(source, "pipeline", "give exactly one of name and file")
    if pc.file is not None:
        p = Path(pc.file)
        return load_graph_file(p if p.is_absolute() else base / p)

    if pc.name not in PIPELINES:
        raise ConfigError(source, "pipeline.name", f"unknown pipeline {pc.name!r}; known: {', '.join(PIPELINES)}")
    try:
        return PIPELINES[pc.name](**pc.params)
    except TypeError as e:
        raise ConfigError(source, "pipeline.params", str(e)) from None
    except ValueError as e:
        raise ConfigError(source, "pipeline.params", str(e)) from None
