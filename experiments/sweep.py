"""Sweeps: one base config, many points, run in parallel, resumable.

A sweep file (YAML; paths relative to it)::

    base: ../configs/demo.yaml        # a config file, or an inline config mapping
    evaluator: analytic               # analytic | des (frames for a robotics base config)
    trace: false                      # write trace.json into each run folder (des, frames: analytic has no timeline)
    grid:                             # every combination
      cluster.network.bandwidth_gbps: [1, 10, 40]
      scheduler.name: [equal, proportional]
    zip:                              # lists of equal length, taken together
      name: [hom, het]
      cluster.devices[1].type: [v100, t4]
    random:                           # seeded samples (numpy Generator)
      samples: 20
      seed: 0
      axes:
        job.global_batch: {low: 64, high: 1024, log: true, int: true}
        job.sync: {choices: [bsp, asp]}

The points are the product grid x zip rows x random samples (a missing part
counts as one empty row), the grid's last axis varying fastest. An axis is a
dotted config path; ``[i]`` indexes a list (``cluster.devices[1].count``).
Overrides are applied to the base config's mapping in the order grid, zip,
random, then the point is validated like any config, with the base config's
folder as the folder relative paths start from. A point's id is the first 12
hex digits of the SHA-256 of the canonical JSON of its resolved config (every
default filled in; the raw mapping when it does not validate) plus the
evaluator; points with the same id run once.

A base config that names a ``board`` is a robotics config (``hetsim dag``,
sim/dag_config.py): its points are planned by the config's DAG scheduler and
run through the frames DES (evaluator ``frames``, the default and only one),
and results.csv carries the DAG metrics (DAG_HEADLINE) before the headline
every run has (HEADLINE_KEYS: a frame counts as an iteration of one sample).

Python API::

    from experiments.sweep import load_sweep, run_sweep
    table = run_sweep(load_sweep("experiments/sweeps/bandwidth_heterogeneity.yaml"),
                      "results/sweeps/bw", jobs=2)      # a pandas.DataFrame

``DIR/results.csv`` gets one row per finished point (appended, fsync'ed, one
``os.write`` per row), after ``DIR/runs/POINT_ID/`` has the run's files (each
written atomically). Rerunning on the same DIR skips points already in the table.

A sweep of more than MAX_POINTS points is refused before anything is made
(``force`` to run it). One sweep at a time writes a folder (``DIR/.sweep.lock``,
:mod:`experiments.sweep_pool`); its worker processes die with it, so after a
``kill -9`` the same command resumes, each point run once.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import time
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from experiments import runner
from experiments import sweep_pool as pool
from experiments.columns import DAG_HEADLINE, FIXED_COLUMNS
from experiments.dag_runner import plan_and_simulate
from experiments.runner import EVALUATORS
from experiments.sweep_pool import SweepInterrupted
from hardware_profiles.errors import ConfigError, HetsimError
from hardware_profiles.fileio import atomic_write, atomic_write_many, fsync_dir
from sim.config import Config, read_yaml
from sim.dag_config import DagConfig, dag_config_from_dict, is_dag_config
from sim.result import HEADLINE_KEYS

__all__ = [
    "EVALUATORS", "MAX_POINTS", "Point", "PointResult", "RandomAxes", "Sweep", "SweepInterrupted", "Task",
    "load_sweep", "parse_path", "point_id", "run_point", "run_sweep", "set_path", "sweep_from_dict",
]

BACKENDS = ("local", "dask")
RESULTS = "results.csv"
_SWEEP_KEYS = ("base", "evaluator", "trace", "grid", "zip", "random")
#: The evaluator of robotics sweeps (a base config naming a `board`): plan, then the frames DES.
FRAMES = "frames"
#: the most points a sweep may have without --force (:meth:`Sweep.check_size`)
MAX_POINTS = 50_000
#: roughly what one point takes in memory before the sweep runs (its resolved config, its
#: task), for the size in the refusal's message
POINT_BYTES = 6_000
_SEGMENT = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")
_INDEX = re.compile(r"\[(\d+)\]")


# ------------------------------------------------------------------ dotted paths
def parse_path(text: str) -> tuple[str | int, ...]:
    """``"cluster.devices[1].count"`` -> ``("cluster", "devices", 1, "count")``.

    Keys are separated by dots; ``[i]`` after a key indexes a list. A key may
    hold any character but ``.``, ``[`` and ``]`` (e.g. ``overrides.t4:1``).

    Raises:
        ValueError: the text is not such a path.
    """
    parts: list[str | int] = []
    for seg in text.split(".") if isinstance(text, str) else [""]:
        m = _SEGMENT.fullmatch(seg)
        if m is None:
            raise ValueError(f"not a dotted path: {text!r} (write list indices as [i], e.g. "
                             "cluster.devices[1].count)")
        parts.append(m.group(1))
        parts.extend(int(i) for i in _INDEX.findall(m.group(2)))
    return tuple(parts)


def format_path(parts: Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out


def _check_schema(tp: Any, parts: tuple[str | int, ...], i: int = 0) -> None:
    """Raise ValueError unless ``parts[i:]`` names a place inside a value of type ``tp``."""
    if i == len(parts) or tp is Any:
        return
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _check_schema(arg, parts, i)
            except ValueError as e:
                errors.append(e)
        raise errors[0]
    part, here = parts[i], format_path(parts[:i]) or "the config"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if not isinstance(part, str):
            raise ValueError(f"{here} is a mapping, not a list")
        if part not in tp.model_fields:
            raise ValueError(f"unknown field {part!r} in {here}; known: {', '.join(tp.model_fields)}")
        return _check_schema(tp.model_fields[part].annotation, parts, i + 1)
    if origin is list:
        if not isinstance(part, int):
            raise ValueError(f"{here} is a list: index it as {here}[i]")
        return _check_schema(typing.get_args(tp)[0], parts, i + 1)
    if origin is dict:
        if not isinstance(part, str):
            raise ValueError(f"{here} is a mapping, not a list")
        return _check_schema(typing.get_args(tp)[1], parts, i + 1)
    raise ValueError(f"{here} holds a single value; it has no {format_path(parts[i:i + 1])!r}")


def set_path(data: dict[str, Any], parts: Sequence[str | int], value: Any) -> None:
    """Set ``data[parts[0]][parts[1]]... = value`` in place.

    Missing mapping keys on the way are created as empty mappings; a list
    index must exist.

    Raises:
        ValueError: an index out of range, or a step into a value that is not
            a mapping or list.
    """
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = format_path(parts[:depth]) or "the config"
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ValueError(f"{where} is {_short(node)}, not a list")
            if part >= len(node):
                raise ValueError(f"index {part} out of range: {where} has {len(node)} entries")
        elif not isinstance(node, dict):
            raise ValueError(f"{where} is {_short(node)}, not a mapping")
        if last:
            node[part] = copy.deepcopy(value)
        else:
            if isinstance(part, str) and node.get(part) is None:
                node[part] = {} if isinstance(parts[depth + 1], str) else []
            node = node[part]


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------ the sweep
@dataclass(frozen=True)
class RandomAxes:
    """``random:`` of a sweep file: ``samples`` draws from a Generator seeded with ``seed``.

    Each axis is ``{low, high, log?, int?}`` (uniform in [low, high], or
    log-uniform when ``log``; ``int`` rounds to an integer, uniform over the
    integers low..high when not ``log``) or ``{choices: [...]}`` (one of them,
    uniformly). Within a sample the axes are drawn in file order.
    """

    samples: int
    seed: int = 0
    axes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def draw(self) -> list[dict[str, Any]]:
        import numpy as np

        rng = np.random.default_rng(self.seed)
        out = []
        for _ in range(self.samples):
            row: dict[str, Any] = {}
            for name, spec in self.axes.items():
                if "choices" in spec:
                    row[name] = copy.deepcopy(spec["choices"][int(rng.integers(len(spec["choices"])))])
                    continue
                lo, hi = spec["low"], spec["high"]
                if spec.get("log"):
                    x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
                    row[name] = min(max(round(x), math.ceil(lo)), math.floor(hi)) if spec.get("int") else x
                elif spec.get("int"):
                    row[name] = int(rng.integers(math.ceil(lo), math.floor(hi), endpoint=True))
                else:
                    row[name] = float(rng.uniform(lo, hi))
            out.append(row)
        return out


@dataclass(frozen=True)
class Point:
    """One point of a sweep.

    Attributes:
        point_id: 12 hex digits identifying the resolved config and evaluator.
        values: swept field (dotted name) -> value, in column order.
        config: the base config mapping with ``values`` applied (what is run).
    """

    point_id: str
    values: dict[str, Any]
    config: dict[str, Any]


@dataclass
class Sweep:
    """A base config and the axes over it. Build one with :func:`load_sweep`,
    :func:`sweep_from_dict`, or directly (the axes are checked here).

    Attributes:
        base: the base config as a plain mapping (as read from YAML).
        base_dir: folder that relative paths inside the config start from.
        evaluator: 'analytic' or 'des'.
        grid, zip: dotted path -> list of values.
        random: seeded random axes, or None.
        trace: write trace.json into each run folder (not for the analytic evaluator, which records no timeline).
        source: the sweep file, for error messages.
        name: used for the default output folder.
    """

    base: dict[str, Any]
    base_dir: Path
    evaluator: str = "analytic"
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: dict[str, list[Any]] = field(default_factory=dict)
    random: RandomAxes | None = None
    trace: bool = False
    source: str = "<sweep>"
    name: str = "sweep"

    @property
    def kind(self) -> str:
        """'dag' for a robotics sweep (its base config names a board), else 'training'."""
        return "dag" if is_dag_config(self.base) else "training"

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        allowed = (FRAMES,) if self.kind == "dag" else EVALUATORS
        if self.evaluator not in allowed:
            raise ConfigError(self.source, "evaluator",
                              f"unknown evaluator {self.evaluator!r} for this base config; "
                              f"use {' or '.join(allowed)}")
        schema = DagConfig if self.kind == "dag" else Config
        seen: set[str] = set()
        lengths: dict[str, int] = {}
        sections: list[tuple[str, dict[str, Any]]] = [
            ("grid", self.grid), ("zip", self.zip), ("random.axes", self.random.axes if self.random else {})]
        for section, axes in sections:
            for axis, values in axes.items():
                try:
                    _check_schema(schema, parse_path(axis))
                except ValueError as e:
                    raise ConfigError(self.source, f"{section}: {axis}", str(e)) from None
                if format_path(parse_path(axis)) in seen:
                    raise ConfigError(self.source, f"{section}: {axis}", "axis given twice")
                seen.add(format_path(parse_path(axis)))
                if section == "random.axes":
                    _check_random_axis(self.source, axis, values)
                elif not isinstance(values, list) or not values:
                    raise ConfigError(self.source, f"{section}: {axis}", "must be a non-empty list of values")
                elif section == "zip":
                    lengths[axis] = len(values)
        if len(set(lengths.values())) > 1:
            axis = next(a for a, n in lengths.items() if n != next(iter(lengths.values())))
            raise ConfigError(self.source, f"zip: {axis}",
                              "zip lists must have equal lengths; got "
                              + ", ".join(f"{a}: {n}" for a, n in lengths.items()))

    def axes(self) -> list[str]:
        """The swept fields in column order (grid, zip, random; file order within)."""
        names = [*self.grid, *self.zip, *(self.random.axes if self.random else {})]
        return [format_path(parse_path(a)) for a in names]

    def columns(self) -> list[str]:
        """The columns of results.csv."""
        first, *rest = FIXED_COLUMNS
        metrics = (*DAG_HEADLINE, *HEADLINE_KEYS) if self.kind == "dag" else HEADLINE_KEYS
        return [first, *self.axes(), *rest, *metrics]

    def size(self) -> int:
        """How many points the axes make (duplicates not yet dropped), counted without
        making them: the grid's combinations x zip rows x random samples."""
        n_grid = math.prod(len(v) for v in self.grid.values())
        n_zip = len(next(iter(self.zip.values()))) if self.zip else 1
        return n_grid * n_zip * (self.random.samples if self.random else 1)

    def check_size(self, limit: int = MAX_POINTS) -> None:
        """Refuse a sweep of more than ``limit`` points before anything is made: every
        point is resolved, validated and held in memory before the first one runs.

        Raises:
            ConfigError: naming the section that makes the most points, the count, the
                limit and ``--force``.
        """
        n = self.size()
        if n <= limit:
            return
        parts = {"grid": math.prod(len(v) for v in self.grid.values()),
                 "zip": len(next(iter(self.zip.values()))) if self.zip else 1,
                 "random.samples": self.random.samples if self.random else 1}
        where = max(parts, key=lambda k: parts[k])
        factors = [*(f"{len(v):,}" for v in self.grid.values()),
                   *([f"{parts['zip']:,} zip rows"] if self.zip else []),
                   *([f"{parts['random.samples']:,} samples"] if self.random else [])]
        made = " x ".join(factors) + " = " if len(factors) > 1 else ""
        raise ConfigError(self.source, where,
                          f"{made}{n:,} points, over the limit of {limit:,} points per sweep: every point "
                          f"is resolved and held in memory (about {_human_bytes(n * POINT_BYTES)} "
                          "here) before the first one runs; split the sweep, or pass --force")

    def points(self, limit: int | None = MAX_POINTS) -> list[Point]:
        """Every point, in order; a point whose id repeats an earlier one is dropped.

        Args:
            limit: the most points to make (None: no limit), checked before any is
                made (:meth:`check_size`).

        Raises:
            ConfigError: more points than ``limit``; an override cannot be applied to
                the base (e.g. a list index out of range), naming the sweep file and the axis.
        """
        if limit is not None:
            self.check_size(limit)
        grid_rows = [dict(zip(self.grid, combo)) for combo in itertools.product(*self.grid.values())]
        n_zip = len(next(iter(self.zip.values()))) if self.zip else 1
        zip_rows = [{a: v[i] for a, v in self.zip.items()} for i in range(n_zip)]
        random_rows = self.random.draw() if self.random else [{}]
        out, seen = [], set()
        for g, z, r in itertools.product(grid_rows, zip_rows, random_rows):
            config = copy.deepcopy(self.base)
            values: dict[str, Any] = {}
            for section, row in (("grid", g), ("zip", z), ("random.axes", r)):
                for axis, value in row.items():
                    parts = parse_path(axis)
                    try:
                        set_path(config, parts, value)
                    except ValueError as e:
                        raise ConfigError(self.source, f"{section}: {axis}", str(e)) from None
                    values[format_path(parts)] = value
            pid = point_id(config, self.evaluator)
            if pid not in seen:
                seen.add(pid)
                out.append(Point(pid, values, config))
        return out


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _check_random_axis(source: str, axis: str, spec: Any) -> None:
    where = f"random.axes: {axis}"
    if not isinstance(spec, dict):
        raise ConfigError(source, where, "must be {low, high, log?, int?} or {choices: [...]}")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ConfigError(source, where, "{choices: [...]} takes no other keys")
        if not isinstance(spec["choices"], list) or not spec["choices"]:
            raise ConfigError(source, where, "choices must be a non-empty list")
        return
    unknown = set(spec) - {"low", "high", "log", "int"}
    if unknown:
        raise ConfigError(source, where, f"unknown key {sorted(unknown)[0]!r}; use low, high, log, int or choices")
    for k in ("low", "high"):
        v = spec.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(source, where, f"{k} must be a finite number")
    for k in ("log", "int"):
        if not isinstance(spec.get(k, False), bool):
            raise ConfigError(source, where, f"{k} must be true or false")
    if spec["low"] > spec["high"]:
        raise ConfigError(source, where, "low must be <= high")
    if spec.get("log") and spec["low"] <= 0:
        raise ConfigError(source, where, "log: true needs low > 0")
    if spec.get("int") and math.ceil(spec["low"]) > math.floor(spec["high"]):
        raise ConfigError(source, where, "int: true needs an integer between low and high")


def point_id(config: dict[str, Any], evaluator: str) -> str:
    """First 12 hex digits of SHA-256 over the canonical JSON of the resolved config
    (defaults filled in, the ``runtime`` section left out; the mapping as given when it
    does not validate) and the evaluator."""
    try:
        schema = DagConfig if is_dag_config(config) else Config
        resolved: Any = schema.model_validate(config).model_dump(mode="json")
        resolved.pop("runtime", None)  # real-runtime options do not change a simulated point
    except ValidationError:
        resolved = config
    text = json.dumps({"config": resolved, "evaluator": evaluator}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def sweep_from_dict(data: Any, source: str = "<sweep>", folder: str | Path = ".") -> Sweep:
    """A Sweep from a parsed sweep file; ``folder`` is where relative paths start."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "a sweep file must be a YAML mapping")
    for key in data:
        if key not in _SWEEP_KEYS:
            raise ConfigError(source, str(key), f"unknown field; known: {', '.join(_SWEEP_KEYS)}")
    folder = Path(folder)
    base = data.get("base")
    if isinstance(base, str):
        base_path = folder / base
        if not base_path.is_file():
            raise ConfigError(source, "base", f"config file not found: {base_path}")
        base_data = read_yaml(base_path)
        if not isinstance(base_data, dict):
            raise ConfigError(str(base_path), "", "a config must be a YAML mapping")
        base_dir = base_path.resolve().parent
    elif isinstance(base, dict):
        base_data, base_dir = base, folder.resolve()
    else:
        raise ConfigError(source, "base", "missing: give a config file path or an inline config mapping")
    for key in ("grid", "zip"):
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(source, key, "must be a mapping of dotted config paths to lists")
    trace = data.get("trace", False)
    if not isinstance(trace, bool):
        raise ConfigError(source, "trace", "must be true or false")
    evaluator = data.get("evaluator", FRAMES if is_dag_config(base_data) else "analytic")
    return Sweep(base=base_data, base_dir=base_dir, evaluator=evaluator,
                 grid=dict(data.get("grid") or {}), zip=dict(data.get("zip") or {}),
                 random=_random_from(data.get("random"), source), trace=trace,
                 source=source, name=Path(source).stem if source != "<sweep>" else "sweep")


def _random_from(data: Any, source: str) -> RandomAxes | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(source, "random", "must be {samples: N, seed: S, axes: {...}}")
    for key in data:
        if key not in ("samples", "seed", "axes"):
            raise ConfigError(source, f"random.{key}", "unknown field; known: samples, seed, axes")
    for key, low in (("samples", 1), ("seed", 0)):
        v = data.get(key, 0 if key == "seed" else None)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(source, f"random.{key}", f"must be an integer >= {low}")
    axes = data.get("axes")
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(source, "random.axes", "must be a non-empty mapping of dotted paths to specs")
    return RandomAxes(samples=data["samples"], seed=data.get("seed", 0), axes=dict(axes))


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (see the module docstring for the format)."""
    p = Path(path)
    return sweep_from_dict(read_yaml(p), str(p), p.parent)


# ------------------------------------------------------------------ one point (worker side)
@dataclass(frozen=True)
class Task:
    """What a worker needs to run one point (plain data, picklable)."""

    point_id: str
    config: dict[str, Any]
    base_dir: str
    source: str
    evaluator: str
    trace: bool


@dataclass
class PointResult:
    """A finished point: status 'ok' or 'error', the error line, headline metrics
    (empty on error) and the run folder's files (name -> text)."""

    point_id: str
    status: str
    error: str
    metrics: dict[str, Any]
    files: dict[str, str]


def run_point(task: Task) -> PointResult:
    """Validate, plan and evaluate one point; never raises for a bad point.

    Top-level so that process pools and dask can pickle it. The files are
    returned, not written: the parent writes them, so remote workers need no
    access to the output folder (only to the files the config names).
    """
    try:
        if task.evaluator == FRAMES:
            return _run_dag_point(task)
        loaded = runner.from_dict(task.config, Path(task.base_dir), task.source)
        problem = runner.problem_of(loaded)
        sched, plan = runner.schedule(loaded, problem)
        result = runner.evaluate(problem, plan, task.evaluator, trace=task.trace, scheduler=sched)
        metrics = {k: _plain(v) for k, v in result.headline().items()}
        return PointResult(task.point_id, "ok", "", metrics,
                           runner.run_files(result, plan, loaded, trace=task.trace))
    except Exception as e:  # a failing point is a row, not a crash
        if isinstance(e, ConfigError) and e.file == task.source:
            msg = f"{e.field}: {e.message}" if e.field else e.message
        elif isinstance(e, HetsimError):
            msg = str(e)
        else:
            msg = f"{type(e).__name__}: {e}"
        return PointResult(task.point_id, "error", " ".join(msg.split()), {}, {})


def _run_dag_point(task: Task) -> PointResult:
    """A robotics point: plan with the config's DAG scheduler, run the frames DES."""
    cfg, problem, opts = dag_config_from_dict(task.config, Path(task.base_dir), task.source)
    row, files = plan_and_simulate(problem, opts, cfg.scheduler.name, cfg.scheduler.params, task.source,
                                   trace_frames=3 if task.trace else 0)
    files["config.json"] = cfg.model_dump_json(indent=1) + "\n"
    return PointResult(task.point_id, "ok", "", {k: _plain(v) for k, v in row.items()}, files)


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):  # numpy scalar
        return v.item()
    return v


# ------------------------------------------------------------------ results.csv
def _cell(v: Any) -> str:
    """One CSV cell, never containing a newline: '' for None, repr for floats
    (exact round trip), canonical JSON for lists, mappings and booleans."""
    v = _plain(v)
    if v is None:
        return ""
    if isinstance(v, str):
        return " ".join(v.splitlines())
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"), default=str)


def _csv_line(cells: Sequence[str]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue().encode()


class _Table:
    """results.csv, appended by the parent only.

    Invariant: the file is a header line plus complete rows, each ending in
    '\\n'; a row is appended with one os.write on an O_APPEND descriptor and
    fsync'ed before the next. A trailing partial line (a crash mid-write) is cut
    off on open by rewriting the file through a temp file and os.replace.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path, self.columns = path, columns
        self.repaired = self._repair()
        self.done: set[str] = set()
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open(newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader)
                if header != columns:
                    raise ConfigError(str(path), "", "its columns differ from this sweep's (the sweep "
                                      "file changed?); use another --out or remove the file")
                self.done = {row[0] for row in reader if row}
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size == 0:
            self._write(_csv_line(columns))

    def _repair(self) -> bool:
        if not self.path.exists():
            return False
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return False
        atomic_write(self.path, data[: data.rfind(b"\n") + 1])
        fsync_dir(self.path.parent)
        return True

    def _write(self, line: bytes) -> None:
        n = os.write(self.fd, line)
        if n != len(line):  # regular files do not short-write short lines; be loud if one does
            raise OSError(f"{self.path}: short write ({n} of {len(line)} bytes)")
        os.fsync(self.fd)

    def append(self, row: dict[str, Any]) -> None:
        self._write(_csv_line([_cell(row.get(c)) for c in self.columns]))
        self.done.add(row["point_id"])

    def close(self) -> None:
        os.close(self.fd)


# ------------------------------------------------------------------ run a sweep
def run_sweep(sweep: Sweep, out: str | Path, jobs: int = 1, backend: str = "local",
              address: str | None = None, progress: bool = True, force: bool = False) -> Any:
    """Run every point of ``sweep`` not yet in ``out/results.csv``.

    Args:
        sweep: from :func:`load_sweep` or :func:`sweep_from_dict`.
        out: output folder: results.csv and runs/POINT_ID/ (created if missing).
        jobs: worker processes (local), or LocalCluster workers (dask without address).
        backend: 'local' (a process pool; jobs=1 runs in this process) or 'dask'.
        address: a dask scheduler address (tcp://host:port); None starts a
            LocalCluster on 127.0.0.1 for the duration of the sweep.
        progress: show a progress bar (done/total, failed, rate, ETA) on stderr.
        force: run a sweep of more than :data:`MAX_POINTS` points.

    Returns:
        pandas.DataFrame of results.csv (every row, in file order).
        ``df.attrs["sweep"]`` holds this run's counts: points, skipped, ok,
        error, wall_s, and csv (the path). ``df.attrs["failed"]``: the ids of
        this sweep's points whose row says ``error``, from this run or an earlier one.

    Raises:
        ConfigError: a bad sweep, one of more than MAX_POINTS points without
            ``force``, an unwritable ``out``, a folder another live sweep is writing,
            or a results.csv written by a sweep with other columns.
        SweepInterrupted: Ctrl-C; workers are stopped and every finished
            point is in the table. Rerun to resume.
    """
    if backend not in BACKENDS:
        raise ConfigError("<command line>", "--backend", f"unknown backend {backend!r}; use local or dask")
    if address is not None and backend != "dask":
        raise ConfigError("<command line>", "--address", "a scheduler address needs --backend dask")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError("<command line>", "--jobs", "must be an integer >= 1")
    t0 = time.perf_counter()
    out = Path(out)
    points = sweep.points(limit=None if force else MAX_POINTS)
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        lock = pool.acquire_lock(out)
    except OSError as e:
        raise ConfigError(str(out), "--out", f"cannot write there: {e.strerror or e}") from None
    try:
        table = _Table(out / RESULTS, sweep.columns())
        try:
            stats = _run_points(sweep, points, table, out, jobs, backend, address, progress, lock)
        finally:
            table.close()
    finally:
        os.close(lock)
    stats["wall_s"] = time.perf_counter() - t0
    df = _dataframe(out / RESULTS, stats)
    ids = {p.point_id for p in points}
    df.attrs["failed"] = [i for i, st in zip(df["point_id"], df["status"]) if i in ids and st != "ok"]
    return df


def _run_points(sweep: Sweep, points: list[Point], table: _Table, out: Path, jobs: int,
                backend: str, address: str | None, progress: bool, lock: int) -> dict[str, Any]:
    from tqdm import tqdm

    todo = [p for p in points if p.point_id not in table.done]
    by_id = {p.point_id: p for p in todo}
    base_dir = str(sweep.base_dir)
    tasks = [Task(p.point_id, p.config, base_dir, f"{sweep.source} [point {p.point_id}]",
                  sweep.evaluator, sweep.trace) for p in todo]
    stats: dict[str, Any] = {"points": len(points), "skipped": len(points) - len(todo), "ok": 0,
                             "error": 0, "csv": str(table.path)}
    workers: Any = pool.InProcess([], run_point)
    bar: Any = None
    try:
        # workers start before the progress bar's thread exists; a Ctrl-C meanwhile is
        # delivered once `workers` can stop them
        with pool.sigint_deferred():
            if tasks and backend == "dask":
                workers = pool.Dask(tasks, jobs, address, run_point, _lost)
            elif tasks:
                workers = (pool.InProcess(tasks, run_point) if jobs == 1 or len(tasks) == 1
                           else pool.LocalPool(tasks, jobs, run_point, close_fds=(lock, table.fd)))
            bar = tqdm(total=len(todo), desc=f"sweep {sweep.name}", unit="pt",
                       disable=not (progress and todo), dynamic_ncols=True)
        for r in workers:
            point = by_id[r.point_id]
            _write_run_dir(out / "runs" / r.point_id, point, sweep.evaluator, r)
            table.append({"point_id": r.point_id, **point.values, "status": r.status,
                          "error": r.error, **r.metrics})
            stats[r.status] += 1
            bar.update(1)
            if r.status == "error":
                bar.set_postfix_str(f"failed {stats['error']}", refresh=False)
    except KeyboardInterrupt:
        prev = pool.set_sigint(signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            workers.close(abort=True)
        finally:
            pool.set_sigint(prev)
            if bar is not None:
                bar.close()
        done = stats["ok"] + stats["error"]
        raise SweepInterrupted(done, len(todo) - done, table.path) from None
    except BaseException:
        workers.close(abort=True)
        if bar is not None:
            bar.close()
        raise
    workers.close(abort=False)
    bar.close()
    return stats


def _lost(point_id: str, message: str) -> PointResult:
    """The row of a point whose worker was lost (dask)."""
    return PointResult(point_id, "error", message, {}, {})


def _write_run_dir(run: Path, point: Point, evaluator: str, r: PointResult) -> None:
    # A folder left by an interrupted attempt (no row yet) is replaced whole. Every file
    # is written atomically and durably before the point's row is appended.
    if run.exists():
        shutil.rmtree(run)
    info = {"point_id": r.point_id, "evaluator": evaluator, "values": point.values,
            "status": r.status, "error": r.error}
    files = {**r.files, "point.json": json.dumps(info, indent=2, default=str) + "\n"}
    atomic_write_many(run, files)


def _dataframe(path: Path, stats: dict[str, Any]) -> Any:
    import pandas as pd

    df = pd.read_csv(path, dtype={"point_id": str, "status": str, "error": str})
    df["error"] = df["error"].fillna("")
    df.attrs["sweep"] = stats
    return df


def read_results(out: str | Path) -> Any:
    """results.csv of a sweep folder as a pandas.DataFrame (point_id and error as text)."""
    return _dataframe(Path(out) / RESULTS, {})
