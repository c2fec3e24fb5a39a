"""Problem = cluster + job + objective (+ dynamics): everything a scheduler may read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware_profiles import load_profile
from hardware_profiles.errors import ConfigError
from sim.cluster import Cluster, Device, Host, Network, Node, Placement
from sim.config import ClusterConfig, Config, NetworkConfig, QuantParamsConfig
from sim.convergence import (
    ConvergenceModel,
    effective_to_target_iterations,
    load_for,
    model_tensor_elems,
)
from sim.dynamics import Dynamic, build_dynamics
from sim.model_specs import resolve_model
from sim.precision import PrecisionError, precision_notes
from sim.quantization import Adaptive
from sim.workload import Model


@dataclass(frozen=True)
class Job:
    """A training job.

    Attributes:
        model: the layer chain.
        global_batch: samples per iteration, summed over workers.
        dtype: training precision (:mod:`sim.precision`): fp32, tf32, fp16 or bf16.
        memory_format: layout of 4-D activations, ``contiguous`` or ``channels_last``.
        iterations: iterations to run (from ``samples`` when given so).
        target_loss: train to this loss instead; ``iterations`` is then the BSP
            prediction of the convergence model (evaluators may run past it).
        sync: 'bsp' | 'asp' | 'ssp' (through the PS shards) | 'allreduce' (collective
            all-reduce among the workers, :mod:`sim.collective`).
        staleness: SSP bound.
        pipeline: layer-wise overlap of push/pull with compute (pulls too, unless a
            runtime emulation says otherwise:
            :attr:`sim.emulation.RuntimeEmulation.pipeline_pulls`).
        quant_bits: gradient bits on the wire (32 = no quantization).
        failure_timeout_s: BSP failure-detection timeout.
        warmup_iterations: iterations excluded from throughput.
        convergence: the model's fitted loss curve (set with ``target_loss`` or
            adaptive quantization).
        quant_adaptive: ``quantization: adaptive``: the policy choosing the width
            from the modelled loss (``quant_bits`` is then its start width); None
            = the fixed width ``quant_bits``.
        quant_every: with ``quant_adaptive``, observe the loss every this many
            global iterations.
        compute_noise: the relative spread (IQR / median) of each worker's compute per
            iteration in the DES (0: none), per worker in device order; see
            :func:`sim.des.engine.noise_factors`.
        allreduce: with ``sync: allreduce``, the algorithm: 'ring', 'tree' or 'hierarchical'.
        bucket_bytes: with ``sync: allreduce``, fp32 gradient bytes per bucket.
        optimizer: with ``sync: allreduce``, the optimizer each worker runs ('sgd',
            'momentum', 'adam'; :func:`sim.costmodel.optimizer_step_s`).
    """

    model: Model
    global_batch: int
    dtype: str = "fp32"
    memory_format: str = "contiguous"
    iterations: int = 100
    target_loss: float | None = None
    sync: str = "bsp"
    staleness: int = 0
    pipeline: bool = False
    quant_bits: int = 32
    failure_timeout_s: float = 5.0
    warmup_iterations: int = 1
    convergence: ConvergenceModel | None = None
    quant_adaptive: Adaptive | None = None
    quant_every: int = 1
    compute_noise: tuple[float, ...] = ()
    allreduce: str = "ring"
    bucket_bytes: float = 25 * 2**20
    optimizer: str = "momentum"


@dataclass(frozen=True)
class Objective:
    minimize: str = "time"
    throughput_min: float | None = None
    deadline_s: float | None = None
    budget_usd: float | None = None


@dataclass(frozen=True)
class Problem:
    """A cluster, a job and what to optimise; ``notes``: what the run does other than
    the config asked (a precision a device runs in another math mode,
    :func:`sim.precision.precision_notes`), said in every summary."""

    name: str
    seed: int
    cluster: Cluster
    job: Job
    objective: Objective = Objective()
    dynamics: tuple[Dynamic, ...] = ()
    notes: tuple[str, ...] = ()


def initial_free_memory_bytes(problem: Problem) -> dict[str, float]:
    """Free memory of every worker device at t = 0 (its memory, times a
    ``free_memory_frac`` status set at t <= 0), by device id."""
    frac = {d.worker: d.free_memory_frac for d in problem.dynamics
            if d.at_s <= 0 and d.free_memory_frac is not None}
    return {dev.id: dev.type.memory_bytes * frac.get(i, 1.0)
            for i, dev in enumerate(problem.cluster.devices)}


def _compute_noise(spec: float | str, devices: Sequence[Device], source: str) -> tuple[float, ...]:
    """``job.compute_noise`` per worker: the number for every worker, or with ``'profile'``
    each device's measured ``spread.iteration_median`` (a profile without one: ConfigError)."""
    if spec != "profile":
        return tuple(float(spec) for _ in devices) if spec else ()
    out = []
    for d in devices:
        rel = (d.type.measurement.spread or {}).get("iteration_median")
        if not isinstance(rel, (int, float)) or rel < 0:
            raise ConfigError(source, "job.compute_noise", f"'profile' needs a measured spread: profile "
                              f"{d.type.name!r} has no spread.iteration_median")
        out.append(float(rel))
    return tuple(out)


def build_problem(cfg: Config, base_dir: Path, source: str = "<config>") -> Problem:
    """Resolve profiles and the model of a validated config into a Problem.

    Dynamics patterns are expanded into events by :func:`sim.dynamics.build_dynamics`
    (seeded from ``cfg.seed``).

    Raises:
        ConfigError: unknown device types or models, bad dynamics, unsupported options.
    """
    cluster = _build_cluster(cfg, base_dir, source)
    job = _build_job(cfg, base_dir, cluster.devices, source)
    dynamics = build_dynamics(cfg.dynamics, cfg.seed, len(cluster.devices), source)
    try:
        notes = precision_notes(list(cluster.types.values()), job.dtype)
    except PrecisionError as e:
        raise ConfigError(source, "job.dtype", str(e)) from None
    o = cfg.objective
    return Problem(
        name=cfg.name,
        seed=cfg.seed,
        cluster=cluster,
        job=job,
        objective=Objective(o.minimize, o.throughput_min, o.deadline_s, o.budget_usd),
        dynamics=dynamics,
        notes=tuple(notes),
    )


def _build_cluster(cfg: Config, base_dir: Path, source: str) -> Cluster:
    """The devices (ids ``TYPE:K``, K counting within the type), the PS shards (``ps:K``;
    none with ``job.sync: allreduce``), the network, the hosts and the nodes of
    ``cfg.cluster``, profiles read from ``cfg.profiles`` (relative to ``base_dir``) and
    then the built-in ones. A device in a node (and not in ``network.overrides``) has
    its equal share of the node's NIC as its link to the PS."""
    dirs = [(base_dir / p) if not Path(p).is_absolute() else Path(p) for p in cfg.profiles]
    for i, d in enumerate(dirs):
        if not d.is_dir():
            raise ConfigError(source, f"profiles[{i}]", f"folder {str(d)!r} not found")
    net = cfg.cluster.network
    devices: list[Device] = []
    for i, entry in enumerate(cfg.cluster.devices):
        prof = load_profile(entry.type, dirs, source=source, field=f"cluster.devices[{i}].type")
        start = sum(1 for d in devices if d.type.name == prof.name)
        for k in range(entry.count):
            dev_id = f"{prof.name}:{start + k}"
            devices.append(Device(dev_id, prof, _bw(net, dev_id, prof.nic_bw_Bps)))
    shards: tuple[Device, ...] = ()
    if cfg.job.sync == "allreduce":
        if "ps" in cfg.cluster.model_fields_set:
            raise ConfigError(source, "cluster.ps", "job.sync: allreduce has no parameter server; "
                              "remove the ps section")
    else:
        ps_prof = load_profile(cfg.cluster.ps.type, dirs, source=source, field="cluster.ps.type")
        shards = tuple(
            Device(f"ps:{k}", ps_prof, _bw(net, f"ps:{k}", ps_prof.nic_bw_Bps))
            for k in range(cfg.cluster.ps.shards)
        )
    known = {d.id for d in devices} | {s.id for s in shards}
    for dev_id in net.overrides:
        if dev_id not in known:
            raise ConfigError(source, f"cluster.network.overrides.{dev_id}", "no such device id")
    nodes = _nodes(cfg.cluster, [d.id for d in devices], net, source)
    for node in nodes:  # a node's devices reach a PS through its NIC, shared alike
        share = node.nic_bw_Bps / len(node.devices)
        devices = [Device(d.id, d.type, share) if d.id in node.devices and d.id not in net.overrides else d
                   for d in devices]
    hosts, placement = _hosts(cfg.cluster, devices, shards, source)
    return Cluster(tuple(devices), shards, Network(net.latency_us * 1e-6, net.sharing), hosts, placement,
                   nodes)


def _device_ids(spec: str, known: Sequence[str]) -> list[str] | None:
    """The device ids of one ``cluster.nodes[].devices`` entry: an id (``'v100:3'``) or a
    range ``'TYPE:A-B'`` (A <= B); None when it names no known device."""
    kind, _, num = spec.rpartition(":")
    lo, dash, hi = num.partition("-")
    if dash and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi):
        ids = [f"{kind}:{k}" for k in range(int(lo), int(hi) + 1)]
        return ids if all(i in known for i in ids) else None
    return [spec] if spec in known else None


def _nodes(cl: ClusterConfig, known: Sequence[str], net: NetworkConfig, source: str) -> tuple[Node, ...]:
    """``cluster.nodes``: each node's devices resolved (ranges expanded) and checked: at
    least one device, every id in the inventory, no device in two nodes, no name twice."""
    if cl.nodes is None:
        return ()
    owner: dict[str, str] = {}
    names: set[str] = set()
    out = []
    for i, nd in enumerate(cl.nodes):
        where = f"cluster.nodes[{i}]"
        if nd.name in names:
            raise ConfigError(source, f"{where}.name", f"node {nd.name!r} is listed twice")
        names.add(nd.name)
        if not nd.devices:
            raise ConfigError(source, f"{where}.devices", "a node needs at least one device")
        ids: list[str] = []
        for j, spec in enumerate(nd.devices):
            got = _device_ids(spec, known)
            if got is None:
                have = ", ".join(known) if len(known) <= 8 else f"{known[0]}, ..., {known[-1]}"
                raise ConfigError(source, f"{where}.devices[{j}]", f"no such device id {spec!r} "
                                  f"(the inventory: {have})")
            for d in got:
                if d in owner:
                    raise ConfigError(source, f"{where}.devices[{j}]",
                                      f"device {d!r} is in node {owner[d]!r} already")
                owner[d] = nd.name
            ids += got
        lat = nd.nic_latency_us if nd.nic_latency_us is not None else net.latency_us
        out.append(Node(nd.name, tuple(ids), nd.intra_gbps * 1e9 / 8, nd.intra_latency_us * 1e-6,
                        nd.nic_gbps * 1e9 / 8, lat * 1e-6))
    return tuple(out)


def _build_job(cfg: Config, base_dir: Path, devices: Sequence[Device], source: str) -> Job:
    """``cfg.job`` resolved: the model, the gradient width (fixed or adaptive), the
    convergence model where one is needed and the iterations to run."""
    j = cfg.job
    model = resolve_model(j.model, base_dir, source)
    quant_adaptive: Adaptive | None = None
    quant_every = 1
    if j.quantization == "adaptive":
        qp = j.quantization_params or QuantParamsConfig()
        quant_adaptive = Adaptive(qp.window, qp.coarse_threshold, qp.fine_threshold, tuple(qp.levels), qp.monotone)
        quant_every = qp.every
        quant_bits = quant_adaptive.start_bits
    else:
        if j.quantization_params is not None:
            raise ConfigError(source, "job.quantization_params", "only with quantization: adaptive")
        quant_bits = 32 if j.quantization == "none" else int(j.quantization)
    convergence = _convergence_of(cfg, model, quant_adaptive is not None, source)
    if j.target_loss is not None:
        assert convergence is not None
        iterations = _to_target(convergence, model, j.target_loss, j.global_batch, quant_bits, source)
    else:
        iterations = j.iterations if j.iterations is not None else math.ceil((j.samples or 0) / j.global_batch)
    return Job(
        model=model,
        global_batch=j.global_batch,
        dtype=j.dtype,
        memory_format=j.memory_format,
        iterations=iterations,
        target_loss=j.target_loss,
        sync=j.sync,
        staleness=j.staleness,
        pipeline=j.pipeline,
        quant_bits=quant_bits,
        failure_timeout_s=j.failure_timeout_s,
        warmup_iterations=min(j.warmup_iterations, max(iterations - 1, 0)),
        convergence=convergence,
        quant_adaptive=quant_adaptive,
        quant_every=quant_every,
        compute_noise=_compute_noise(j.compute_noise, devices, source),
        allreduce=j.allreduce,
        bucket_bytes=j.bucket_mb * 2**20,
        optimizer=j.optimizer,
    )


def _convergence_of(cfg: Config, model: Model, adaptive: bool, source: str) -> ConvergenceModel | None:
    """The model's fitted convergence model (sim/convergence_fits/) when the job needs one:
    a target loss or adaptive quantization; None otherwise."""
    j = cfg.job
    if not adaptive and j.target_loss is None:
        return None
    fit = load_for(model.name)
    if fit is None:
        field, why = (("job.target_loss", "use iterations or samples") if j.target_loss is not None
                      else ("job.quantization", "adaptive quantization follows the modelled loss"))
        raise ConfigError(source, field, f"no convergence fit for model {model.name!r} "
                          f"(sim/convergence_fits/); {why}")
    return fit.model


def _hosts(cl: ClusterConfig, devices: list[Device], shards: tuple[Device, ...],
           source: str) -> tuple[tuple[Host, ...], tuple[tuple[str, Placement], ...]]:
    """``cluster.hosts`` and each device's placement (device id -> Placement)."""
    if cl.hosts is None:
        for i, e in enumerate(cl.devices):
            if e.host is not None:
                raise ConfigError(source, f"cluster.devices[{i}].host", "no cluster.hosts section to name")
        if cl.ps.host is not None:
            raise ConfigError(source, "cluster.ps.host", "no cluster.hosts section to name")
        return (), ()
    index: dict[str, int] = {}
    for k, h in enumerate(cl.hosts):
        if h.name in index:
            raise ConfigError(source, f"cluster.hosts[{k}].name", f"host {h.name!r} is listed twice")
        index[h.name] = k
    hosts = tuple(Host(h.name, h.cores, float(h.background_threads),
                       h.copy_gbps * 1e9 / 8 if h.copy_gbps is not None else 0.0,
                       h.wake_us * 1e-6 if h.wake_us is not None else 0.0) for h in cl.hosts)

    def place(e: Any, field: str) -> Placement | None:
        if e.host is None:
            return None
        if e.host not in index:
            raise ConfigError(source, f"{field}.host", f"no host named {e.host!r} in cluster.hosts")
        h = index[e.host]
        aff = tuple(e.affinity) if e.affinity is not None else None
        if aff is not None and max(aff) >= hosts[h].cores:
            raise ConfigError(source, f"{field}.affinity",
                              f"core {max(aff)} is not on host {e.host!r} ({hosts[h].cores} cores: 0 .. "
                              f"{hosts[h].cores - 1})")
        return Placement(h, e.threads or 1, aff)

    placement: list[tuple[str, Placement]] = []
    start = 0
    for i, e in enumerate(cl.devices):
        pl = place(e, f"cluster.devices[{i}]")
        if pl is not None:
            placement += [(d.id, pl) for d in devices[start:start + e.count]]
        start += e.count
    pl = place(cl.ps, "cluster.ps")
    if pl is not None:
        placement += [(s.id, pl) for s in shards]
    return hosts, tuple(placement)


def _to_target(m: ConvergenceModel, model: Model, target: float, batch: int, bits: int,
               source: str) -> int:
    """The iterations BSP needs to reach ``target`` under the fitted model ``m``."""
    if target <= m.L_inf:
        raise ConfigError(source, "job.target_loss",
                          f"{target} is not above the fitted asymptotic loss {m.L_inf:.4g} of {model.name!r}")
    return effective_to_target_iterations(m, target, batch, bits, model_tensor_elems(model))


def _bw(net: object, dev_id: str, default_Bps: float) -> float:
    overrides = net.overrides  # type: ignore[attr-defined]
    if dev_id in overrides:
        return float(overrides[dev_id]) * 1e9 / 8
    gbps = net.bandwidth_gbps  # type: ignore[attr-defined]
    return float(gbps) * 1e9 / 8 if gbps is not None else float(default_Bps)
