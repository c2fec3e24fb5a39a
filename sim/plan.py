"""Plans: what a scheduler decides, as versioned JSON.

Every plan carries its :class:`PlanKind`, and :func:`sim.evaluate.evaluate`
dispatches on it. :class:`Plan` serves both training problems of
ARCHITECTURE.md: data-parallel PS training (H-PS, ``DATA_PARALLEL``) is the
one-stage plan with uneven per-replica batch shares; layer placement
(HeterPS, ``PLACEMENT``) is the plan of layer ranges on device types, run as
a pipeline of stages. A robotics task graph's schedule (``DAG``) is a
:class:`sim.dag.DagPlan`.

Plan JSON schema 2 writes the kind; schema-1 files (no kind) are read through
:func:`migrate_plan_dict`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write

PLAN_SCHEMA = 2


class PlanKind(StrEnum):
    """What a plan is, and so which model evaluates it (:func:`sim.evaluate.evaluate`).

    * ``DATA_PARALLEL``: one stage of every layer, per-replica batch shares,
      parameters on PS shards (Problem A); online schedulers may rebalance it.
    * ``PLACEMENT``: layer ranges on device types (Problem B), run as a pipeline
      of stages (sim/multistage.py, sim/des/pipeline.py); static. One stage is a
      placement too when a placement scheduler chose it.
    * ``DAG``: a periodic task graph scheduled on an embedded board's units
      (:class:`sim.dag.DagPlan`), run by the frames DES.
    """

    DATA_PARALLEL = "data_parallel"
    PLACEMENT = "placement"
    DAG = "dag"


@dataclass(frozen=True)
class Replica:
    """One device instance of a stage and the samples it processes per iteration."""

    device: str
    batch: int


@dataclass(frozen=True)
class Stage:
    """A contiguous layer range [first_layer, end_layer) run data-parallel on ``replicas``."""

    first_layer: int
    end_layer: int
    replicas: tuple[Replica, ...]
    device_type: str | None = None  # set when every replica has one type

    @property
    def batch(self) -> int:
        return sum(r.batch for r in self.replicas)


@dataclass(frozen=True)
class Plan:
    """Stages plus the PS shards that hold the parameters, of kind ``DATA_PARALLEL``
    (one stage) or ``PLACEMENT`` (see :class:`PlanKind`)."""

    stages: tuple[Stage, ...]
    ps_shards: tuple[str, ...]
    scheduler: str = ""
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: PlanKind = PlanKind.DATA_PARALLEL

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PlanKind(self.kind))  # the enum, also when given its value
        if self.kind is PlanKind.DAG:
            raise ValueError("a Plan is data_parallel or placement; a DAG schedule is a sim.dag.DagPlan")
        if self.kind is PlanKind.DATA_PARALLEL and len(self.stages) > 1:
            raise ValueError(f"a data_parallel plan has one stage, not {len(self.stages)}; "
                             "a plan of several stages is a placement")

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return tuple(r for s in self.stages for r in s.replicas)

    def with_shares(self, shares: dict[str, int]) -> Plan:
        """The same single-stage plan with new per-device batch shares (0 drops a replica)."""
        if len(self.stages) != 1:
            raise ValueError("with_shares applies to single-stage (data-parallel) plans")
        st = self.stages[0]
        reps = tuple(Replica(r.device, int(shares.get(r.device, r.batch))) for r in st.replicas)
        reps = tuple(r for r in reps if r.batch > 0)
        return Plan((Stage(st.first_layer, st.end_layer, reps, st.device_type),), self.ps_shards,
                    self.scheduler, dict(self.options), self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "kind": self.kind.value,
            "scheduler": self.scheduler,
            "stages": [
                {
                    "layers": [s.first_layer, s.end_layer],
                    "device_type": s.device_type,
                    "replicas": [{"device": r.device, "batch": r.batch} for r in s.replicas],
                }
                for s in self.stages
            ],
            "ps_shards": list(self.ps_shards),
            "options": self.options,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        atomic_write(path, self.dumps())


def require_kind(plan: Plan, kind: PlanKind, evaluator: str) -> None:
    """Raise ValueError unless ``plan`` is of ``kind``, the only kind ``evaluator`` runs
    (:func:`sim.evaluate.evaluate` picks the evaluator of a plan's kind)."""
    if plan.kind is not kind:
        raise ValueError(f"{evaluator} runs {kind} plans, not {plan.kind} ones; "
                         "sim.evaluate.evaluate dispatches on the plan's kind")


def migrate_plan_dict(d: dict[str, Any]) -> dict[str, Any]:
    """Plan JSON of an older schema as the current schema reads it (``d`` itself when current).

    Schema 1 had no ``kind``: a plan was a placement when it had several stages
    or its options held ``"placement"`` (what a placement scheduler writes), and
    data-parallel otherwise. Schema 2 is schema 1 plus that kind, written out.
    """
    if d.get("schema") != 1:
        return d
    stages, options = d.get("stages"), d.get("options")
    placement = ((isinstance(stages, list) and len(stages) > 1)
                 or (isinstance(options, dict) and "placement" in options))
    return {**d, "schema": 2, "kind": (PlanKind.PLACEMENT if placement else PlanKind.DATA_PARALLEL).value}


def plan_from_dict(d: Any, source: str = "<plan>") -> Plan:
    """Parse plan JSON (schema 2, or 1 through :func:`migrate_plan_dict`) with one-line errors."""
    if not isinstance(d, dict):
        raise ConfigError(source, "", "a plan must be a JSON object")
    d = migrate_plan_dict(d)
    if d.get("schema") != PLAN_SCHEMA:
        raise ConfigError(source, "schema",
                          f"unsupported plan schema {d.get('schema')!r} (expected {PLAN_SCHEMA}, or 1)")
    unknown = set(d) - {"schema", "kind", "scheduler", "stages", "ps_shards", "options"}
    if unknown:
        raise ConfigError(source, sorted(unknown)[0], "unknown field")
    training = (PlanKind.DATA_PARALLEL.value, PlanKind.PLACEMENT.value)
    if d.get("kind") not in training:
        raise ConfigError(source, "kind", f"must be one of {', '.join(training)}, got {d.get('kind')!r}")
    stages = []
    raw_stages = d.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ConfigError(source, "stages", "must be a non-empty list")
    for i, s in enumerate(raw_stages):
        try:
            a, b = s["layers"]
            reps = tuple(Replica(r["device"], r["batch"]) for r in s["replicas"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(source, f"stages[{i}]", f"malformed stage ({e})") from None
        for k, x in enumerate((a, b)):
            _exact_int(x, source, f"stages[{i}].layers[{k}]")
        for k, r in enumerate(reps):
            _exact_int(r.batch, source, f"stages[{i}].replicas[{k}].batch")
            if not isinstance(r.device, str):
                raise ConfigError(source, f"stages[{i}].replicas[{k}].device", f"must be a device id, got {r.device!r}")
        if not isinstance(s.get("device_type"), str | None):
            raise ConfigError(source, f"stages[{i}].device_type", f"must be a device type or null, got "
                              f"{s['device_type']!r}")
        stages.append(Stage(a, b, reps, s.get("device_type")))
    raw_shards, raw_options = d.get("ps_shards", []), d.get("options") or {}
    if not isinstance(raw_shards, list) or not all(isinstance(x, str) for x in raw_shards):
        raise ConfigError(source, "ps_shards", f"must be a list of PS shard ids ('ps:K'), got {raw_shards!r}")
    if not isinstance(raw_options, dict):
        raise ConfigError(source, "options", f"must be a mapping, got {raw_options!r}")
    if not isinstance(d.get("scheduler", ""), str):
        raise ConfigError(source, "scheduler", f"must be a name, got {d['scheduler']!r}")
    shards, options = tuple(raw_shards), dict(raw_options)
    try:
        return Plan(tuple(stages), shards, str(d.get("scheduler", "")), options, PlanKind(d["kind"]))
    except ValueError as e:
        raise ConfigError(source, "kind", str(e)) from None


def _exact_int(x: Any, source: str, where: str) -> None:
    """An integer as written (119, not 119.5, 119.0 or "119"): a share is never rounded
    or converted silently."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise ConfigError(source, where, f"must be an integer, got {x!r}")


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), "", "file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), "", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(str(p), "", f"cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(str(p), f"line {e.lineno}", f"malformed JSON: {e.msg}") from None
    return plan_from_dict(data, str(p))


def check_plan(plan: Plan, problem: Any, source: str = "<plan>") -> None:
    """Raise ConfigError unless ``plan`` is executable for ``problem``.

    Checks: layer ranges tile the model in order, devices exist and are used
    once, batch shares are positive and each stage's sum to the global batch,
    the PS shards exist (with ``job.sync: allreduce``: one data-parallel stage and
    no PS shards).
    """
    n_layers = len(problem.job.model.layers)
    expect = 0
    used: set[str] = set()
    for i, st in enumerate(plan.stages):
        if st.first_layer != expect or st.end_layer <= st.first_layer:
            raise ConfigError(source, f"stages[{i}].layers", "stages must tile the layers in order")
        expect = st.end_layer
        if not st.replicas:
            raise ConfigError(source, f"stages[{i}].replicas", "a stage needs at least one replica")
        for k, r in enumerate(st.replicas):
            where = f"stages[{i}].replicas[{k}]"
            if not problem.cluster.has(r.device) or r.device.startswith("ps:"):
                raise ConfigError(source, f"{where}.device", f"unknown device {r.device!r}")
            if r.device in used:
                raise ConfigError(source, f"{where}.device", f"device {r.device!r} used twice")
            used.add(r.device)
            if r.batch <= 0:
                raise ConfigError(source, f"{where}.batch", f"must be > 0, got {r.batch}")
        if st.batch != problem.job.global_batch:
            raise ConfigError(
                source, f"stages[{i}].replicas",
                f"batch shares sum to {st.batch}, not the global batch {problem.job.global_batch}",
            )
    if expect != n_layers:
        raise ConfigError(source, "stages", f"stages cover {expect} of {n_layers} layers")
    if problem.job.sync == "allreduce":
        if len(plan.stages) > 1 or plan.kind is not PlanKind.DATA_PARALLEL:
            raise ConfigError(source, "kind", "job.sync: allreduce runs data-parallel plans only")
        if plan.ps_shards:
            raise ConfigError(source, "ps_shards", "job.sync: allreduce has no PS shards")
        return
    for k, s in enumerate(plan.ps_shards):
        if not problem.cluster.has(s) or not s.startswith("ps:"):
            raise ConfigError(source, f"ps_shards[{k}]", f"unknown PS shard {s!r}")
    if not plan.ps_shards:
        raise ConfigError(source, "ps_shards", "a plan needs at least one PS shard")
