"""The experiment config (YAML): typed, validated, documented.

Every field carries a description; unknown fields are errors. A config is
turned into a :class:`sim.problem.Problem` by :func:`sim.problem.build_problem`.
The resolved config (defaults filled in) is written next to every result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from hardware_profiles.errors import ConfigError
from sim import overrides
from sim.quantization import Adaptive

#: the largest job.global_batch (shares are computed in 64-bit floating point)
MAX_GLOBAL_BATCH = 2**32


class _Strict(BaseModel):
    # strict: a YAML `true` is not the integer 1; no inf/nan where numbers are expected
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Placed(_Strict):
    """Where the processes of an entry run (with ``cluster.hosts``); each of its
    devices is one process with these ``threads`` and ``affinity``."""

    host: str | None = Field(None, description="name of the cluster.hosts entry its processes run on "
                             "(none: the device's compute is its own)")
    threads: int | None = Field(None, ge=1, description="with host: compute threads per process (default 1)")
    affinity: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="with host: core indices each process may run on (default: all)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # the host fields appear in the resolved config only when given: configs
        # without hosts resolve exactly as before they existed
        out = handler(self)
        for k in ("host", "threads", "affinity"):
            if out.get(k, 0) is None:
                del out[k]
        return out

    @model_validator(mode="after")
    def _with_host(self) -> _Placed:
        for k in ("threads", "affinity"):
            if getattr(self, k) is not None and self.host is None:
                raise ValueError(f"{k} is given only with host")
        if self.affinity is not None and len(set(self.affinity)) != len(self.affinity):
            raise ValueError("affinity lists a core twice")
        return self


class DeviceEntry(_Placed):
    """One line of the inventory: ``count`` devices of profile ``type``."""

    type: str = Field(description="device profile name, e.g. 'v100'")
    count: int = Field(1, ge=1, description="how many exist")


class PSConfig(_Placed):
    """Parameter-server shards; parameters are partitioned across them by bytes."""

    shards: int = Field(1, ge=1, description="number of PS shards")
    type: str = Field("cpu-16c", description="device profile each shard runs on")


class HostConfig(_Strict):
    """A machine whose cores the processes placed on it share (see sim.des.hosts)."""

    name: str = Field(min_length=1, description="what devices' `host:` refers to")
    cores: int = Field(ge=1, description="cores the processes may run on (indices 0 .. cores - 1)")
    background_threads: float = Field(
        0.0, ge=0, description="runnable threads of other jobs, always competing on every core")
    copy_gbps: float | None = Field(
        None, gt=0, description="Gbit/s one core copies into or out of a process for a message: "
        "each end of a message then costs its process CPU time on this host (loopback transfers); "
        "absent: messages cost no CPU")
    wake_us: float | None = Field(
        None, ge=0, description="microseconds a process waits for a core after a message arrives "
        "for it while every core of this host is busy (the scheduler's wake-up latency); absent: 0")


class NetworkConfig(_Strict):
    """Per-node NIC bandwidth and latency; flows share a link's bandwidth equally."""

    bandwidth_gbps: float | None = Field(
        None, gt=0, description="every node's NIC, Gbit/s (default: each profile's nic_bw_Bps)"
    )
    latency_us: float = Field(50.0, ge=0, description="one-way latency of a message, microseconds")
    sharing: Literal["fair", "none"] = Field(
        "fair",
        description="fair: a link's bandwidth is split among its concurrent flows; "
        "none: an ideal non-blocking network (every flow gets its endpoints' full bandwidth)",
    )
    overrides: dict[str, float] = Field(
        default_factory=dict, description="device id (e.g. 't4:1' or 'ps:0') -> NIC Gbit/s"
    )

    @field_validator("overrides")
    @classmethod
    def _pos(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not x > 0:
                raise ValueError(f"bandwidth of {k!r} must be > 0")
        return v


class NodeConfig(_Strict):
    """A machine holding some of the inventory's devices: the links inside it (NVLink,
    PCIe) and its NIC to the other nodes (see sim.collective)."""

    name: str = Field(min_length=1, description="the node's name")
    devices: list[str] = Field(description="device ids it holds ('v100:0'), or ranges 'v100:0-7'")
    intra_gbps: float = Field(gt=0, description="Gbit/s of each device's link inside the node, per direction "
                              "(NVLink, PCIe)")
    intra_latency_us: float = Field(5.0, ge=0, description="one-way latency of a message inside the node, "
                                    "microseconds")
    nic_gbps: float = Field(gt=0, description="Gbit/s of the node's NIC to other nodes, per direction")
    nic_latency_us: float | None = Field(None, ge=0, description="one-way latency between nodes, microseconds "
                                         "(default: cluster.network.latency_us)")


class ClusterConfig(_Strict):
    devices: list[DeviceEntry] = Field(min_length=1, description="the inventory")
    ps: PSConfig = Field(default_factory=PSConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    hosts: list[HostConfig] | None = Field(
        None, description="machines whose cores processes share (devices and ps name one with `host:`); "
        "none: every device computes on its own")
    nodes: list[NodeConfig] | None = Field(
        None, description="machines grouping devices: a link inside each and a NIC between them "
        "(all-reduce topology; a PS worker's link is its share of its node's NIC); devices in no node "
        "keep the flat network")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for k in ("hosts", "nodes"):
            if out.get(k, 0) is None:
                del out[k]
        return out


QuantSpec = Literal["none", "adaptive", 32, 16, 8, 4, 2]


BitWidth = Literal[2, 4, 8, 16, 32]
_DEFAULT_LEVELS: tuple[BitWidth, ...] = (2, 4, 8, 16, 32)


class QuantParamsConfig(_Strict):
    """Parameters of ``quantization: adaptive`` (sim.quantization.Adaptive; defaults are its defaults)."""

    window: int = Field(5, ge=2, description="loss observations the relative fall is measured over")
    coarse_threshold: float = Field(0.10, description="relative fall at or above which the coarsest width is used")
    fine_threshold: float = Field(0.01, description="relative fall at or below which the finest width is used")
    levels: list[BitWidth] = Field(
        default_factory=lambda: list(_DEFAULT_LEVELS), description="widths to choose from, strictly ascending"
    )
    monotone: bool = Field(True, description="never go coarser again")
    every: int = Field(1, ge=1, description="observe the loss (and maybe change width) every this many iterations")

    @model_validator(mode="after")
    def _policy(self) -> QuantParamsConfig:
        Adaptive(self.window, self.coarse_threshold, self.fine_threshold, tuple(self.levels), self.monotone)
        return self


#: Job fields that apply to sync: allreduce only.
ALLREDUCE_FIELDS = ("allreduce", "bucket_mb", "optimizer")


class JobConfig(_Strict):
    """What to train and how."""

    model: str | dict[str, Any] = Field(
        description="zoo name | {file: model.yaml} | {torch: 'pkg.mod:fn', input: [..]}"
    )
    global_batch: int = Field(gt=0, description="samples per (global) iteration (at most 2^32)")
    dtype: Literal["fp32", "tf32", "fp16", "bf16"] = Field(
        "fp32", description="training precision: fp32; tf32 (fp32 storage, TF32 tensor-core "
        "matmuls and convolutions); fp16 or bf16 (mixed precision as torch.autocast: half-"
        "precision matmuls, fp32 master weights and autocast's fp32 ops); see sim.precision")
    memory_format: Literal["contiguous", "channels_last"] = Field(
        "contiguous", description="layout of 4-D activations (torch's names): contiguous "
        "(NCHW) or channels_last (NHWC); tensor-core convolutions in contiguous layout pay "
        "layout transposes where the profile lists that correction")
    iterations: int | None = Field(None, gt=0, description="iterations to run")
    samples: int | None = Field(None, gt=0, description="or: samples to process")
    target_loss: float | None = Field(None, gt=0, description="or: train to this loss")
    sync: Literal["bsp", "asp", "ssp", "allreduce"] = Field(
        "bsp", description="synchronisation: through the PS shards (bsp, asp, ssp) or by collective "
        "all-reduce among the workers (allreduce: every worker applies the update; no cluster.ps)")
    allreduce: Literal["ring", "tree", "hierarchical"] = Field(
        "ring", description="with sync: allreduce, the algorithm (hierarchical: reduce inside each "
        "cluster.nodes entry, all-reduce across nodes, broadcast inside)")
    bucket_mb: float = Field(25.0, gt=0, description="with sync: allreduce, MiB of fp32 gradients per "
                             "bucket, cut in reverse layer order (DDP's bucket_cap_mb)")
    optimizer: Literal["sgd", "momentum", "adam"] = Field(
        "momentum", description="with sync: allreduce, the optimizer every worker runs after the all-reduce")
    staleness: int = Field(0, ge=0, description="SSP bound: iterations a worker may run ahead")
    pipeline: bool = Field(False, description="layer-wise overlap of push/pull with compute")
    quantization: QuantSpec = Field("none", description="gradient bits on the wire")
    quantization_params: QuantParamsConfig | None = Field(
        None, description="with quantization: adaptive, the policy's parameters (default: its defaults)"
    )
    failure_timeout_s: float = Field(5.0, gt=0, description="BSP failure-detection timeout")
    warmup_iterations: int = Field(1, ge=0, description="iterations excluded from throughput")
    compute_noise: Annotated[float, Field(ge=0, le=10)] | Literal["profile"] = Field(
        0.0, description="DES: each worker's compute per iteration drawn around its modelled time, with this "
        "relative spread (IQR / median; 'profile': each device's measured spread.iteration_median)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # quantization_params, compute_noise and memory_format appear in the resolved config
        # only when given (a sweep point's id hashes the config: fields with their default
        # left out keep the ids of configs written before them)
        out = handler(self)
        if out.get("quantization_params", 0) is None:
            del out["quantization_params"]
        if out.get("compute_noise") == 0:
            del out["compute_noise"]
        if out.get("memory_format") == "contiguous":
            del out["memory_format"]
        if out.get("sync") != "allreduce":  # all-reduce's fields only where they apply
            for k in ALLREDUCE_FIELDS:
                out.pop(k, None)
        return out

    @field_validator("global_batch")
    @classmethod
    def _batch_bound(cls, v: int) -> int:
        if v > MAX_GLOBAL_BATCH:
            raise ValueError(f"at most 2^32 = {MAX_GLOBAL_BATCH} (got {v}): shares are computed in "
                             "floating point, exact only well below 2^53")
        return v

    @model_validator(mode="after")
    def _amount(self) -> JobConfig:
        given = [k for k in ("iterations", "samples", "target_loss") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of iterations, samples, target_loss (got {', '.join(given)})")
        if not given:
            self.iterations = 100
        if self.sync != "allreduce":
            for k in ALLREDUCE_FIELDS:
                if k in self.model_fields_set:
                    raise ValueError(f"{k} is given only with sync: allreduce")
        return self


class ObjectiveConfig(_Strict):
    minimize: Literal["time", "cost", "energy"] = "time"
    throughput_min: float | None = Field(None, gt=0, description="samples/s at least")
    deadline_s: float | None = Field(None, gt=0)
    budget_usd: float | None = Field(None, gt=0)


class SchedulerConfig(_Strict):
    name: str = Field("proportional", description="registered scheduler name")
    params: dict[str, Any] = Field(default_factory=dict, description="scheduler parameters")


class DynamicsEntry(_Strict):
    """A change of one worker's status at a time: slowdown and/or free memory, or a failure."""

    worker: int = Field(ge=0, description="worker index in inventory order")
    at_s: float = Field(ge=0, description="simulated time of the change")
    slowdown: float | None = Field(None, gt=0, description="compute-time multiplier from at_s on")
    free_memory: float | None = Field(
        None, gt=0, le=1, description="fraction of the device's memory free for training from at_s on"
    )
    fail: bool = Field(False, description="the worker dies at at_s")

    @model_validator(mode="after")
    def _one(self) -> DynamicsEntry:
        status = self.slowdown is not None or self.free_memory is not None
        if status == self.fail:
            raise ValueError("give slowdown: X and/or free_memory: F, or fail: true alone")
        return self


Workers = list[Annotated[int, Field(ge=0)]] | Literal["all"]


def _check_workers(v: Any) -> Any:
    if isinstance(v, str) and v != "all":
        raise ValueError(f"give a list of worker indices or 'all' (got {v!r})")
    if isinstance(v, list):
        if not v:
            raise ValueError("give at least one worker (or 'all')")
        seen: set[Any] = set()
        for w in v:
            if isinstance(w, int) and not isinstance(w, bool) and w in seen:
                raise ValueError(f"worker {w} is listed twice")
            seen.add(w)
    return v


class _StatusPattern(_Strict):
    """What every generated status trace shares: the workers it applies to, and
    at least one of slowdown and free memory."""

    workers: Workers = Field(description="worker indices (inventory order) or 'all'")

    _workers = field_validator("workers", mode="before")(_check_workers)

    @model_validator(mode="after")
    def _some(self) -> _StatusPattern:
        if getattr(self, "slowdown", None) is None and getattr(self, "free_memory", None) is None:
            raise ValueError("give slowdown and/or free_memory")
        return self


class StepsPattern(_StatusPattern):
    """Piecewise-constant status: from ``times_s[k]`` on, ``slowdown[k]`` / ``free_memory[k]``."""

    pattern: Literal["steps"] = Field(description="pattern name")
    times_s: list[Annotated[float, Field(ge=0)]] = Field(
        min_length=1, description="change times, strictly increasing"
    )
    slowdown: list[Annotated[float, Field(gt=0)]] | None = Field(
        None, description="compute-time multiplier from times_s[k] on (one per time)"
    )
    free_memory: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        None, description="fraction of memory free from times_s[k] on (one per time)"
    )

    @field_validator("times_s")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        for a, b in zip(v, v[1:]):
            if not b > a:
                raise ValueError(f"times must be strictly increasing ({a} then {b})")
        return v

    @field_validator("slowdown", "free_memory")
    @classmethod
    def _same_length(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        times = info.data.get("times_s")
        if v is not None and times is not None and len(v) != len(times):
            raise ValueError(f"{len(v)} values but times_s has {len(times)}")
        return v



class Walk(_Strict):
    """One clamped random walk in log space: ``x <- clip(x * exp(sigma * N(0, 1)), min, max)``."""

    min: float = Field(gt=0, description="lower clamp")
    max: float = Field(gt=0, description="upper clamp, >= min")
    start: float = Field(gt=0, description="value at t = 0, within [min, max]")
    sigma: float = Field(ge=0, description="standard deviation of one step of log(value)")

    @field_validator("max")
    @classmethod
    def _order(cls, v: float, info: ValidationInfo) -> float:
        lo = info.data.get("min")
        if lo is not None and v < lo:
            raise ValueError(f"max {v} is below min {lo}")
        return v

    @field_validator("start")
    @classmethod
    def _inside(cls, v: float, info: ValidationInfo) -> float:
        lo, hi = info.data.get("min"), info.data.get("max")
        if lo is not None and hi is not None and not lo <= v <= hi:
            raise ValueError(f"start {v} is outside [min, max] = [{lo}, {hi}]")
        return v


class RandomWalkPattern(_StatusPattern):
    """Seeded random walks of slowdown and/or free memory, one step every ``every_s``."""

    pattern: Literal["random_walk"] = Field(description="pattern name")
    every_s: float = Field(gt=0, description="time between steps; the first value (start) is at t = 0")
    until_s: float = Field(gt=0, description="no steps at or after this time; the last value holds")
    slowdown: Walk | None = Field(None, description="walk of the compute-time multiplier")
    free_memory: Walk | None = Field(None, description="walk of the free-memory fraction (max <= 1)")


    @field_validator("free_memory")
    @classmethod
    def _fraction(cls, v: Walk | None) -> Walk | None:
        if v is not None and v.max > 1:
            raise ValueError(f"max {v.max} is above 1 (a fraction of memory)")
        return v



class PeriodicPattern(_StatusPattern):
    """A co-located job active for ``duty * period_s`` of every period, from ``phase_s`` on."""

    pattern: Literal["periodic"] = Field(description="pattern name")
    period_s: float = Field(gt=0, description="period of the co-located job")
    duty: float = Field(gt=0, lt=1, description="fraction of each period it is active, in (0, 1)")
    phase_s: float = Field(0.0, ge=0, description="start of the first active window")
    random_phase: bool = Field(
        False, description="add a seeded per-worker offset drawn uniformly from [0, period_s) to phase_s"
    )
    until_s: float = Field(gt=0, description="no window starts at or after this; one active then ends here")
    slowdown: float | None = Field(None, gt=0, description="compute-time multiplier while active (1.0 otherwise)")
    free_memory: float | None = Field(
        None, gt=0, le=1, description="free-memory fraction while active (1.0 otherwise)"
    )




Pattern = StepsPattern | RandomWalkPattern | PeriodicPattern
PATTERNS = ("steps", "random_walk", "periodic")


def _dynamics_tag(v: Any) -> str | None:
    # An entry without `pattern` is an explicit event; an unknown pattern has no tag.
    p = v.get("pattern", "event") if isinstance(v, dict) else getattr(v, "pattern", "event")
    return p if p == "event" or p in PATTERNS else None


DynamicsItem = Annotated[
    Annotated[DynamicsEntry, Tag("event")]
    | Annotated[StepsPattern, Tag("steps")]
    | Annotated[RandomWalkPattern, Tag("random_walk")]
    | Annotated[PeriodicPattern, Tag("periodic")],
    Discriminator(
        _dynamics_tag,
        custom_error_type="unknown_pattern",
        custom_error_message="pattern must be one of " + ", ".join(PATTERNS),
    ),
]
_DYNAMICS_TAGS = {"event", *PATTERNS}


class Config(_Strict):
    """A whole experiment: cluster, job, objective, scheduler, dynamics."""

    name: str = Field("experiment", description="names the default output folder results/NAME/: "
                      "a plain file name (no path separators, not '.' or '..')")
    seed: int = Field(0, ge=0)
    profiles: list[str] = Field(default_factory=list, description="extra profile folders")
    cluster: ClusterConfig
    job: JobConfig
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    dynamics: list[DynamicsItem] = Field(
        default_factory=list,
        description="status changes: explicit events and seeded patterns (see sim.dynamics)",
    )
    runtime: dict[str, Any] | None = Field(
        None, description="options of the real runtime (`hetsim run`; runtime/spec.py validates "
        "them); the simulator ignores them")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # all-reduce has no parameter server: no cluster.ps in its resolved config
        out = handler(self)
        if self.job.sync == "allreduce":
            out["cluster"].pop("ps", None)
        return out


    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        check_plain_name(v)
        return v


def check_plain_name(v: str) -> None:
    """Refuse a name that would place an output outside its folder (ValueError): empty,
    '.', '..', a path separator, a NUL or another control character."""
    if v in ("", ".", "..") or any(c in v for c in "/\\") or any(ord(c) < 32 for c in v):
        raise ValueError(f"must be a plain file name (no path separators, not '.' or '..'), got {v!r}")


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _loc(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as 'a.b[0].c' (union and validator tags dropped)."""
    out = ""
    prev: Any = None
    for part in loc:
        tag = isinstance(prev, int) and part in _DYNAMICS_TAGS
        prev = part
        if tag:
            continue  # the dynamics union's tag after a list index
        if isinstance(part, int):
            out += f"[{part}]"
        elif any(ch in str(part) for ch in "[(") or str(part) in _TYPE_TAGS:
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_names(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the pydantic model at ``loc`` below ``model`` (list indexes and
    union members followed; [] where the path leaves the models)."""
    import typing

    def models_in(tp: Any) -> list[Any]:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return [tp]
        return [m for a in typing.get_args(tp) for m in models_in(a)]

    current = [model]
    for key in loc:
        if isinstance(key, int):
            continue
        nxt = []
        for m in current:
            f = m.model_fields.get(key)
            if f is not None:
                nxt += models_in(f.annotation)
        current = nxt
    return sorted({n for m in current for n in m.model_fields})


def validation_error(source: str, e: ValidationError, model: Any = None) -> ConfigError:
    """The first pydantic error as a one-line ConfigError. An unknown field goes first (a
    misspelt required field is both unknown and missing; the spelling is what to fix), with
    the missing field of the same section it most resembles, or else the field of
    ``model`` (default :class:`Config`) there, as a suggestion."""
    import difflib

    errors = e.errors()
    extra = [x for x in errors if x["type"] == "extra_forbidden"]
    err = extra[0] if extra else errors[0]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
        parent, name = tuple(err["loc"][:-1]), str(err["loc"][-1])
        missing = [str(x["loc"][-1]) for x in errors
                   if x["type"] == "missing" and tuple(x["loc"][:-1]) == parent]
        known = missing or _field_names(model or Config, parent)
        if close := difflib.get_close_matches(name, known, n=1, cutoff=0.6):
            msg += f" (did you mean {close[0]!r}?)"
    elif err["type"] == "missing":
        msg = "missing required field"
    loc = _loc(tuple(err["loc"]))
    if err["type"] == "unknown_pattern":
        loc += ".pattern"
    return ConfigError(source, loc, msg)


def config_from_dict(data: Any, source: str) -> Config:
    if not isinstance(data, dict):
        raise ConfigError(source, "", "a config must be a YAML mapping")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise validation_error(source, e) from None


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping that names one key twice (PyYAML keeps the last silently)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a mapping that names a key twice: every YAML file of
    the project (configs, models, sweeps, task graphs) is read through it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merge keys (<<) first: a merged key may be overridden
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if dup:
                raise _DuplicateKey("while constructing a mapping", node.start_mark,
                                    f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)


def parse_yaml(text: str) -> Any:
    """Parse YAML text with :class:`UniqueKeyLoader` (yaml.YAMLError on bad text)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; missing, binary, malformed files and duplicate keys become
    one-line ConfigErrors. The ``--set`` overrides registered for the file
    (:mod:`sim.overrides`) are applied."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), "", "file not found")
    try:
        data = parse_yaml(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), "", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(str(p), "", f"cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        why = str(getattr(e, "problem", None) or e).splitlines()[0]
        raise ConfigError(str(p), where, f"malformed YAML: {why}") from None
    ov = overrides.registered(p)  # the command line's --set for this file
    return overrides.apply(data, ov) if ov else data


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    return config_from_dict(read_yaml(path), str(path))
