"""What every rank of a real run needs to know: :class:`RunSpec`, built from a
Problem, its Plan and the runtime options.

Runtime options come from a ``runtime:`` section of the config YAML (taken out
before the config is validated, so the rest stays the simulator's config) or
from ``plan.options["runtime"]``; the config's section wins field by field.
Emulated heterogeneity on one machine is per worker (plan order): torch
threads, CPU affinity and a slowdown factor (after a forward/backward pass of
``t`` seconds the worker sleeps ``(factor - 1) * t``). The config's explicit
``dynamics`` (events, and patterns as expanded into events) map onto the same
knobs: ``slowdown`` from ``at_s`` (wall seconds since the worker started) and
``fail`` (the worker process kills itself with SIGKILL at ``at_s``).
``free_memory`` changes are not emulated (they are listed in ``summary.json``
under ``runtime_ignored``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hardware_profiles.errors import ConfigError
from runtime.affinity import usable_cpus
from sim import zoo
from sim.config import validation_error
from sim.plan import Plan
from sim.problem import Problem
from sim.quantization import Adaptive
from sim.scheduling import OnlineScheduler

#: seconds the ranks of a run have to join its process group (and, in an all-reduce plan, the
#: coordinator's control channel: runtime.coordinator)
CONNECT_TIMEOUT_S = 120.0

if TYPE_CHECKING:
    from runtime.stages import BoundarySpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class WorkerOptions(_Strict):
    """Emulation of one worker (plan order)."""

    threads: int | None = Field(None, ge=1, description="torch intra-op threads (default: runtime.threads)")
    affinity: list[int] | None = Field(None, description="CPU ids the process is pinned to (Linux)")
    slowdown: float = Field(1.0, ge=1.0, description="compute-time multiplier from the start")
    fail_at_iteration: int | None = Field(
        None, ge=0, description="the process kills itself (SIGKILL) before starting this iteration")
    free_memory_bytes: float | None = Field(
        None, gt=0, description="report this free memory instead of the measured one")


class RuntimeOptions(_Strict):
    """The ``runtime:`` section of a config (or ``plan.options["runtime"]``)."""

    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="sizes passed to sim.zoo.torch_module (e.g. hidden: [32])")
    lr: float = Field(0.1, gt=0, description="SGD learning rate applied at the PS")
    threads: int = Field(1, ge=1, description="torch threads of every rank unless a worker says otherwise")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="where workers compute (cuda: worker w on GPU w modulo the GPUs; under torchrun the GPU "
        "of its LOCAL_RANK; an all-reduce plan wants a GPU per worker)")
    workers: list[WorkerOptions] = Field(default_factory=list, description="per worker, plan order")
    ps_affinity: list[int] | None = Field(
        None, description="CPU ids every PS shard process is pinned to (Linux; absent: not pinned)")
    coordinator_affinity: list[int] | None = Field(
        None, description="job.sync: allreduce: CPU ids the coordinator (rank 0) is pinned to (Linux; "
        "absent: not pinned)")
    max_trace_spans: int = Field(20_000, ge=0, description="spans kept per worker for trace.json")
    checkpoint_every: int = Field(
        0, ge=0, description="PS shards checkpoint every N committed iterations and at the end, "
        "under OUT/checkpoint (0: never); `hetsim run --resume` continues from the last one (BSP only)")
    crash_after_iteration: int | None = Field(
        None, ge=0, description="fault injection: rank 0 SIGKILLs itself once this iteration has "
        "committed (and been checkpointed, when one is due)")
    micro_batches: int | None = Field(
        None, ge=1, description="multi-stage plans: micro-batches per iteration (default: the number "
        "of stages)")
    pipeline_pulls: bool = Field(
        False, description="with job.pipeline: pulls layer-wise too (each tensor applied and sent as soon "
        "as every worker's gradient of it is in; forward waits per layer); BSP, one-stage plans")
    gloo_loop_nice: int = Field(
        0, ge=0, le=19, description="niceness of gloo's event loop thread in every rank (Linux; 0: left "
        "as it is). The loop spins while a thread of its process holds a socket's lock; niced, it lets "
        "the holder run where they share a core, but yields to compute there too "
        "(runtime.affinity.lower_priority)")


@dataclass
class WorkerSpec:
    device: str
    threads: int
    affinity: list[int] | None
    slowdown_events: list[tuple[float, float]]  # (at_s, factor), sorted; factor 1.0 before the first
    fail_at_iteration: int | None
    fail_at_s: float | None
    free_memory_bytes: float | None
    cpu: bool = False  # computes on CPU whatever runtime.device: a CPU device type of a multi-stage plan


@dataclass
class StageSpec:
    """One stage of a multi-stage plan (see :mod:`runtime.stages`)."""

    layers: tuple[int, int]  # the plan's layer range
    blocks: tuple[int, int]  # the block range of runtime.stages.blocks
    workers: list[int]  # its replicas' worker indices (plan order)
    shares: list[int]  # their samples per iteration (sum: the global batch)
    params: list[int]  # indices in module.parameters() of the parameters it trains
    boundary: BoundarySpec | None  # the tensors it sends on (None for the last stage)


@dataclass(frozen=True)
class Manifest:
    """The last complete checkpoint: its version and files (name -> sha256); written and read
    by :mod:`runtime.checkpoint`."""

    folder: str
    version: int
    files: dict[str, str]
    fingerprint: dict[str, Any]


@dataclass
class RunSpec:
    """Everything the ranks of one run share (pickled to spawned processes)."""

    name: str
    seed: int
    model: str
    model_kwargs: dict[str, Any]
    global_batch: int
    iterations: int
    sync: str
    staleness: int
    bits: int
    adaptive: Adaptive | None
    quant_every: int
    lr: float
    failure_timeout_s: float
    warmup: int
    workers: list[WorkerSpec]
    shards: list[str]
    plan: Plan
    pipeline: bool = False  # push each gradient as its backward finishes
    pipeline_pulls: bool = False  # and pull each tensor as it is applied (runtime.pulls)
    gloo_loop_nice: int = 0  # niceness of gloo's event loop threads (runtime.affinity.lower_priority)
    device: str = "cpu"
    threads: int = 1
    ps_affinity: list[int] | None = None  # CPU ids of every PS shard process (None: not pinned)
    timeout_s: float = 600.0
    max_trace_spans: int = 20_000
    scheduler: Any = None  # an OnlineScheduler (rank 0 calls rebalance) or None
    # (id, role, price_per_hour, idle_w, active_w) of each worker then each shard
    devices: list[tuple[str, str, float, float, float]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None  # set by experiments.run from --out
    resume: Manifest | None = None  # the checkpoint this run continues from
    crash_after_iteration: int | None = None
    stages: list[StageSpec] = field(default_factory=list)  # empty: a one-stage (data-parallel) plan
    # multi-stage plans: tables of the first stage pulled and pushed by touched rows only
    # (index in module.parameters() -> row length)
    sparse: dict[int, int] = field(default_factory=dict)
    micro_batches: int = 1
    # job.sync: allreduce (runtime.collective): fp32 gradient bytes per bucket, the workers'
    # optimizer, and the CPU ids of the coordinator (rank 0)
    bucket_bytes: float = 25 * 2**20
    optimizer: str = "momentum"
    coordinator_affinity: list[int] | None = None

    @property
    def multistage(self) -> bool:
        return bool(self.stages)

    @property
    def allreduce(self) -> bool:
        """The workers reduce among themselves; rank 0 only coordinates (runtime.collective)."""
        return self.sync == "allreduce"

    @property
    def first_worker(self) -> int:
        """The rank of worker 0: after the PS shards, or after the coordinator (all-reduce)."""
        return 1 if self.allreduce else self.n_shards

    @property
    def world_size(self) -> int:
        return self.first_worker + self.n_workers

    def stage_of(self, w: int) -> int:
        """The stage of worker ``w`` (0 for every worker of a one-stage plan)."""
        for s, st in enumerate(self.stages):
            if w in st.workers:
                return s
        return 0

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def shares(self) -> list[int]:
        have = {r.device: r.batch for r in self.plan.replicas}
        return [have.get(w.device, 0) for w in self.workers]


def parse_options(data: Any, source: str) -> RuntimeOptions:
    if data is None:
        return RuntimeOptions()
    if not isinstance(data, dict):
        raise ConfigError(source, "runtime", "must be a mapping")
    try:
        return RuntimeOptions.model_validate(data)
    except ValidationError as e:
        err = validation_error(source, e, RuntimeOptions)
        raise ConfigError(source, f"runtime.{err.field}" if err.field else "runtime", err.message) from None


def check_cpus(cpus: list[int] | None, source: str, field_name: str) -> None:
    """Raise ConfigError unless every CPU id in ``cpus`` is one this process may run on
    (Linux; elsewhere, and for None, nothing is checked)."""
    here = usable_cpus()
    if cpus is None or here is None:
        return
    if not cpus:
        raise ConfigError(source, field_name, "names no CPU (leave it out to not pin)")
    twice = sorted({c for c in cpus if cpus.count(c) > 1})
    if twice:
        raise ConfigError(source, field_name, f"lists CPU {twice[0]} twice")
    missing = sorted(set(cpus) - set(here))
    if missing:
        raise ConfigError(source, field_name, f"CPU {missing[0]} is not one this machine lets the run use "
                          f"(available: {', '.join(map(str, here))})")


def build_spec(problem: Problem, plan: Plan, opts: RuntimeOptions, scheduler: Any = None,
               iterations: int | None = None, timeout_s: float = 600.0, source: str = "<config>",
               plan_source: str | None = None) -> RunSpec:
    """The RunSpec of ``plan`` on ``problem``.

    ``source`` names the config in errors, ``plan_source`` the plan (default: the config).

    Raises:
        ConfigError: a model outside the zoo, worker options for more workers
            than the plan has, or a multi-stage plan the runtime cannot run
            (:func:`pipeline_stages`).
    """
    job = problem.job
    name = job.model.name
    if name not in zoo.names():
        raise ConfigError(source, "job.model", f"the runtime trains zoo models only "
                          f"({', '.join(zoo.names())}), not {name!r}")
    stages: list[StageSpec] = []
    sparse: dict[int, int] = {}
    if len(plan.stages) > 1:
        stages, sparse = pipeline_stages(problem, plan, opts, source, plan_source or source)
    check_run_options(problem, opts, bool(stages), source)
    devices = [r.device for r in plan.replicas]
    if len(opts.workers) > len(devices):
        raise ConfigError(source, "runtime.workers",
                          f"{len(opts.workers)} entries for {len(devices)} workers of the plan")
    pinned = [(f"runtime.workers[{w}].affinity", o.affinity) for w, o in enumerate(opts.workers)]
    for field_name, cpus in [*pinned, ("runtime.ps_affinity", opts.ps_affinity),
                             ("runtime.coordinator_affinity", opts.coordinator_affinity)]:
        check_cpus(cpus, source, field_name)
    workers, ignored = worker_specs(problem, devices, opts, bool(stages))
    # a pipeline's shares are fixed per stage: no online rebalancing of multi-stage plans
    online = scheduler if isinstance(scheduler, OnlineScheduler) and not stages else None
    return RunSpec(
        name=problem.name, seed=problem.seed, model=name, model_kwargs=dict(opts.model_kwargs),
        global_batch=job.global_batch, iterations=iterations or job.iterations, sync=job.sync,
        staleness=job.staleness, bits=job.quant_bits, adaptive=job.quant_adaptive,
        quant_every=job.quant_every, lr=opts.lr, failure_timeout_s=job.failure_timeout_s,
        warmup=job.warmup_iterations, workers=workers, shards=list(plan.ps_shards), plan=plan,
        pipeline=job.pipeline, pipeline_pulls=opts.pipeline_pulls, gloo_loop_nice=opts.gloo_loop_nice,
        device=opts.device, threads=opts.threads,
        ps_affinity=opts.ps_affinity, timeout_s=timeout_s,
        max_trace_spans=opts.max_trace_spans, scheduler=online, devices=priced_devices(problem, plan),
        ignored=ignored, checkpoint_every=opts.checkpoint_every, crash_after_iteration=opts.crash_after_iteration,
        stages=stages, micro_batches=(opts.micro_batches or len(plan.stages)) if stages else 1,
        sparse=sparse, bucket_bytes=job.bucket_bytes, optimizer=job.optimizer,
        coordinator_affinity=opts.coordinator_affinity,
    )


def check_run_options(problem: Problem, opts: RuntimeOptions, multistage: bool, source: str) -> None:
    """Refuse runtime options the job cannot run with: checkpoints off BSP, pipelined pulls
    without pipelined pushes, off BSP or on a multi-stage plan.

    Raises:
        ConfigError: naming the option and why.
    """
    job = problem.job
    if job.sync == "allreduce":
        check_allreduce_options(problem, opts, source)
    if opts.checkpoint_every and job.sync != "bsp":
        raise ConfigError(source, "runtime.checkpoint_every", f"checkpoints are built for job.sync: bsp "
                          f"only, not {job.sync} (shards applying pushes on arrival have no common cut)")
    if opts.pipeline_pulls:
        why = ("needs job.pipeline: true (the pushes pipelined)" if not job.pipeline
               else f"is built for job.sync: bsp only, not {job.sync}" if job.sync != "bsp"
               else "is built for one-stage plans only" if multistage
               else "is built for runtime.device: cpu only (its receiver takes values straight into the "
               "parameters over gloo, which moves CPU memory)" if opts.device == "cuda" else "")
        if why:
            raise ConfigError(source, "runtime.pipeline_pulls", why)


def check_allreduce_options(problem: Problem, opts: RuntimeOptions, source: str) -> None:
    """Refuse what the all-reduce runtime (runtime.collective) does not run: gradients
    other than fp32 or 16-bit (sent as fp16), adaptive widths, PS-only options.

    Raises:
        ConfigError: naming the field and why.
    """
    job = problem.job
    if job.quant_adaptive is not None or job.quant_bits not in (16, 32):
        raise ConfigError(source, "job.quantization", "the all-reduce runtime sends fp32 or fp16 gradients "
                          "(quantization: none or 16); other widths are simulated only")
    for name in ("ps_affinity", "crash_after_iteration"):
        if getattr(opts, name) is not None:
            raise ConfigError(source, f"runtime.{name}", "is an option of PS runs, not of job.sync: allreduce")
    if opts.device == "cuda":
        # nccl collectives block on a dead peer rather than fail: the group is never re-formed
        hang = "in an all-reduce plan on cuda would hang the others in nccl: emulate failures on cpu"
        for w, o in enumerate(opts.workers):
            if o.fail_at_iteration is not None:
                raise ConfigError(source, f"runtime.workers[{w}].fail_at_iteration", f"a worker killed {hang}")
        if any(d.fail for d in problem.dynamics):
            raise ConfigError(source, "dynamics", f"a worker failure {hang}")


def worker_specs(problem: Problem, devices: list[str], opts: RuntimeOptions,
                 multistage: bool) -> tuple[list[WorkerSpec], list[str]]:
    """One WorkerSpec per plan replica (device ``devices[w]``): its options (threads,
    affinity, slowdown, failure) merged with the problem's dynamics events for that
    device; and the events the runtime cannot emulate (free-memory changes), named."""
    inventory = [d.id for d in problem.cluster.devices]
    workers, ignored = [], []
    for w, dev in enumerate(devices):
        o = opts.workers[w] if w < len(opts.workers) else WorkerOptions()
        slow: list[tuple[float, float]] = [(0.0, o.slowdown)] if o.slowdown != 1.0 else []
        fail_s = None
        for d in problem.dynamics:
            if inventory[d.worker] != dev:
                continue
            if d.slowdown is not None:
                slow.append((d.at_s, d.slowdown * o.slowdown))
            if d.fail:
                fail_s = d.at_s if fail_s is None else min(fail_s, d.at_s)
            if d.free_memory_frac is not None:
                ignored.append(f"free_memory event of {dev} at {d.at_s} s")
        # a pipeline's stages run where the plan put them: a CPU type's replicas (the
        # embedding stage of a HeterPS placement, typically) stay on CPU under device: cuda
        on_cpu = multistage and problem.cluster.device(dev).type.kind == "cpu"
        workers.append(WorkerSpec(dev, o.threads or opts.threads, o.affinity, sorted(slow),
                                  o.fail_at_iteration, fail_s, o.free_memory_bytes, on_cpu))
    return workers, ignored


def priced_devices(problem: Problem, plan: Plan) -> list[tuple[str, str, float, float, float]]:
    """(id, role, price per hour, idle W, active W) of the plan's workers, then its PS shards."""
    devs = []
    for dev in (r.device for r in plan.replicas):
        t = problem.cluster.device(dev).type
        devs.append((dev, "worker", t.price_per_hour, t.power_w.idle, t.power_w.active))
    for sid in plan.ps_shards:
        t = problem.cluster.device(sid).type
        devs.append((sid, "ps", t.price_per_hour, t.power_w.idle, t.power_w.active))
    return devs


def pipeline_stages(problem: Problem, plan: Plan, opts: RuntimeOptions, source: str,
                    plan_source: str) -> tuple[list[StageSpec], dict[int, int]]:
    """The stages of a multi-stage plan, its layer ranges mapped onto the runtime's module,
    and the embedding tables of its first stage, pulled and pushed by touched rows only
    (index in ``module.parameters()`` -> row length; the first stage's input holds their ids).

    The runtime's module (the zoo model with ``runtime.model_kwargs``) must have
    the layer list of the plan's model (the same names in the same order, from
    :func:`sim.torch_extract.from_torch`): the plan's layer indices then mean
    the same modules in both.

    Raises:
        ConfigError: a sync other than BSP, more micro-batches than
            the global batch, a module whose layers differ from the plan's model
            (``runtime.model_kwargs``), or a stage boundary inside a block
            (``stages[i].layers`` of the plan).
    """
    from runtime import stages as st
    from runtime import task
    from sim.torch_extract import from_torch

    job = problem.job
    if job.sync != "bsp":
        raise ConfigError(source, "job.sync", f"multi-stage plans run under bsp only, not {job.sync}")
    micro = opts.micro_batches or len(plan.stages)
    if micro > job.global_batch:
        raise ConfigError(source, "runtime.micro_batches",
                          f"{micro} micro-batches of a global batch of {job.global_batch}")
    module, example = task.build(job.model.name, problem.seed, opts.model_kwargs)
    mine = [ly.name for ly in from_torch(module, example).layers]
    want = [ly.name for ly in job.model.layers]
    if mine != want:
        first = next((i for i, (a, b) in enumerate(zip(mine, want)) if a != b), min(len(mine), len(want)))
        raise ConfigError(source, "runtime.model_kwargs",
                          f"the module has {len(mine)} layers and the plan's model {len(want)}; they differ "
                          f"from layer {first}: stage boundaries cannot be mapped (keep the depth, change "
                          f"the widths)")
    cuts = [(s.first_layer, s.end_layer) for s in plan.stages]
    spans = st.stage_blocks(job.model.name, module, want, cuts, plan_source)
    bs = st.blocks(job.model.name, module)
    bounds = st.probe_boundaries(job.model.name, module, example, spans)
    out, w = [], 0
    for i, s in enumerate(plan.stages):
        n = len(s.replicas)
        out.append(StageSpec((s.first_layer, s.end_layer), spans[i], list(range(w, w + n)),
                              [r.batch for r in s.replicas], st.stage_params(module, bs[slice(*spans[i])]),
                              bounds[i] if i < len(bounds) else None))
        w += n
    sparse = {i: d for i, d in st.sparse_tables(job.model.name, module).items() if i in set(out[0].params)}
    return out, sparse
