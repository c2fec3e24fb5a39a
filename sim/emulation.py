"""The runtime on this machine, as the evaluators model it: :class:`RuntimeEmulation`.

``hetsim validate`` compares the simulator with a real run of the same plan by
the runtime (:mod:`runtime`), every rank a process on one machine. The real run
does things a config does not describe: each worker labels its batch with a
teacher's forward pass, ``runtime.workers[i].slowdown`` sleeps, messages are
the runtime's loopback path on the machine's cores, one at a time per rank,
pulls come back whole, and each process spends more CPU than the model
charges. A :class:`RuntimeEmulation` states all of that as one typed input,
handed to the evaluators beside the problem (:func:`sim.evaluate.evaluate`,
:func:`sim.des.simulate`, :func:`sim.analytic.evaluate`, and the placement
entry points); ``None`` there is a plain simulation of the problem.

Part of an emulation is what a config could say (a host and each process's
place on it, NIC bandwidths, slowdown events, a layer and its profile table):
:func:`emulated_problem` states that part as the :class:`~sim.problem.Problem`
every evaluator then runs. The rest only the data-parallel DES models, read by
it from the emulation: each process's CPU scales (:mod:`sim.des.hosts`), serial
messages (:mod:`sim.des.transport`) and whole pulls (:mod:`sim.des.state`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from hardware_profiles.errors import ConfigError
from hardware_profiles.schema import LayerTable
from sim import costmodel
from sim.cluster import Device, Host, Placement
from sim.dynamics import Dynamic
from sim.problem import Problem
from sim.workload import Layer, Model

#: The name of the teacher's layer (:func:`teacher_layer`).
TEACHER = "teacher"


class CpuScale(NamedTuple):
    """What one process's work costs it in CPU, relative to what the DES gives it.

    Attributes:
        compute: every second of work the DES gives the process (its compute, a
            shard's aggregation and update, its messages' copies) costs it this
            many seconds of CPU on its host.
        copies: its messages' copies cost this many times more again, on top of
            ``compute`` (the runtime CPU model scales a process's compute and its
            transport apart).
    """

    compute: float = 1.0
    copies: float = 1.0


@dataclass(frozen=True)
class RuntimeEmulation:
    """Everything the simulated side of sim-vs-real adds to a problem; see the module docstring.

    Attributes:
        host: the machine every rank runs on: its cores, the background load of
            other jobs (``background_threads``), the CPU a message's copy costs
            each end (``copy_Bps``) and the wake-up latency of a message to a busy
            host (``wake_s``). It replaces the problem's hosts and placement.
            None: the problem's own hosts, if any.
        placement: with ``host``, each rank's process on it (device id ->
            :class:`~sim.cluster.Placement` of host 0: its threads and affinity).
        wire_Bps: every worker's and shard's link bandwidth (bytes/s, each
            direction) in place of its NIC's: the rate of the runtime's loopback
            messages. 0: the NICs of the problem.
        serial_messages: each process placed on a host sends one message at a
            time and receives one at a time, in the order issued (the runtime's
            ranks: blocking sends from one thread, a shard's one receiver thread
            and its main thread answering pulls in turn). False: a process's
            messages share its links at once. Data-parallel DES only.
        message_copies: False: messages cost no CPU on any host (every host's
            ``copy_Bps`` taken as 0), a diagnostic of the copies' share.
        teacher: each worker first labels its batch with a forward pass of a
            teacher of the student's architecture: the model gets a leading
            parameter-free layer :data:`TEACHER` priced, through a table of each
            worker's profile, at the student's forward on the same batch, with
            no backward (:func:`with_teacher`).
        pipeline_pulls: with ``job.pipeline``, whether pulls are layer-wise too
            (a chunk's parameters leave the shard as soon as it is applied and a
            worker's forward of a layer group waits for its own chunks). False:
            only pushes are; a worker's chunks leave once all of them are
            applied (BSP: the whole iteration; ASP/SSP: all of that worker's
            push) and its forward starts when every one has arrived, as the
            runtime does without ``runtime.pipeline_pulls``. Data-parallel DES
            only (the analytic evaluator models full pipelining).
        slowdowns: device id -> factor its compute is slowed by from t = 0 (the
            runtime's emulated slowdowns), as slowdown events at t = 0 after the
            problem's own events at that time.
        cpu_scales: device id -> :class:`CpuScale` of the process placed on a
            host (a process not listed: 1 and 1). Data-parallel DES only.
        allreduce_latency_s, allreduce_Bps: an all-reduce plan's ring as the ranks'
            measured all-reduce of two processes, ``L + S / B`` for ``S`` bytes
            (``network.allreduce_latency_s``, ``allreduce_bw_Bps``): each step's hop at
            ``L / 2`` and ``B``, in place of ``wire_Bps`` and the network's latency (a
            2-member ring's ``2 (lat + S / 2 / bw)`` is then the measurement), ``B``
            divided by the member's stretch on its host when the ring's members share
            cores (:meth:`sim.cluster.Cluster.host_stretch` with every member runnable
            on one thread, gloo's; the measurement had a core per rank). Ring plans on
            a flat network only (a tree's or a node's steps are not a ring's). 0: those.
    """

    host: Host | None = None
    placement: tuple[tuple[str, Placement], ...] = ()
    wire_Bps: float = 0.0
    serial_messages: bool = False
    message_copies: bool = True
    teacher: bool = False
    pipeline_pulls: bool = True
    slowdowns: tuple[tuple[str, float], ...] = ()
    cpu_scales: tuple[tuple[str, CpuScale], ...] = ()
    allreduce_latency_s: float = 0.0
    allreduce_Bps: float = 0.0

    def __post_init__(self) -> None:
        for dev, s in self.cpu_scales:
            if not (s.compute > 0 and s.copies > 0):  # NaN too
                raise ValueError(f"the CPU scales of {dev!r} must be > 0, got {tuple(s)}")
        for dev, f in self.slowdowns:
            if not f > 0:
                raise ValueError(f"the slowdown of {dev!r} must be > 0, got {f}")
        for name in ("wire_Bps", "allreduce_latency_s", "allreduce_Bps"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be >= 0 and finite, got {v}")
        if self.placement and self.host is None:
            raise ValueError("a placement needs the host it places on")
        if any(pl.host != 0 for _, pl in self.placement):
            raise ValueError("a placement of the emulation's host is on host 0")
        object.__setattr__(self, "_cpu", dict(self.cpu_scales))

    def cpu_scale(self, device_id: str) -> CpuScale:
        """The :class:`CpuScale` of ``device_id``'s process (1 and 1 where none is given)."""
        return self._cpu.get(device_id, CpuScale())  # type: ignore[attr-defined, no-any-return]

    def scaled(self, scales: Mapping[str, tuple[float, float]]) -> RuntimeEmulation:
        """This emulation with each listed process's CPU scaled further by ``scales[device]``
        (``(compute, copies)``, e.g. :meth:`calibration.runtime_cpu.RuntimeCpuModel.scales`):
        multiplied into its scales, the others kept."""
        out = dict(self.cpu_scales)
        for dev, (compute, copies) in scales.items():
            old = out.get(dev, CpuScale())
            out[dev] = CpuScale(old.compute * compute, old.copies * copies)
        return dataclasses.replace(self, cpu_scales=tuple(out.items()))


def emulated_problem(problem: Problem, emulation: RuntimeEmulation | None) -> Problem:
    """``problem`` with the part of ``emulation`` a config could state: the teacher's layer
    and each worker's table for it, the slowdowns as events at t = 0 (the dynamics then
    in time order), every rank on the emulation's host, the links at ``wire_Bps`` (a ring
    all-reduce's at ``allreduce_Bps`` over each member's stretch, its latency
    ``allreduce_latency_s / 2``: :class:`RuntimeEmulation`) and the hosts' copies free of
    CPU without ``message_copies``. ``problem`` itself where ``emulation`` is None.

    Raises:
        ConfigError: a worker's profile already has a table for the teacher's signature.
    """
    if emulation is None:
        return problem
    e, cl, job = emulation, problem.cluster, problem.job
    if e.teacher:
        cl = dataclasses.replace(cl, devices=tuple(_teacher_profile(d, job.model, job.dtype, job.global_batch)
                                                   for d in cl.devices))
        job = dataclasses.replace(job, model=with_teacher(job.model))
    index = {d.id: i for i, d in enumerate(cl.devices)}
    extra = [Dynamic(index[dev], 0.0, slowdown=f) for dev, f in e.slowdowns]
    dynamics = tuple(sorted((*problem.dynamics, *extra), key=lambda d: d.at_s))
    hosts, placement = (cl.hosts, cl.placement) if e.host is None else ((e.host,), e.placement)
    if not e.message_copies:
        hosts = tuple(dataclasses.replace(h, copy_Bps=0.0) for h in hosts)
    devices, shards = cl.devices, cl.shards
    if e.wire_Bps > 0:
        devices = tuple(dataclasses.replace(d, nic_bw_Bps=e.wire_Bps) for d in devices)
        shards = tuple(dataclasses.replace(d, nic_bw_Bps=e.wire_Bps) for d in shards)
    cluster = dataclasses.replace(cl, devices=devices, shards=shards, hosts=hosts, placement=placement)
    if job.sync == "allreduce" and job.allreduce == "ring" and not cl.nodes and e.allreduce_Bps > 0:
        # The measured B is a rank's, with a core to itself: every member moves its bytes
        # at once, on one thread (gloo's), so a member sharing its cores with others moves
        # them at one thread's fair share, whatever its compute threads.
        one = tuple((dev, dataclasses.replace(pl, threads=1)) for dev, pl in cluster.placement)
        stretch = dataclasses.replace(cluster, placement=one).host_stretch([d.id for d in devices])
        devices = tuple(dataclasses.replace(d, nic_bw_Bps=e.allreduce_Bps / f) for d, f in zip(devices, stretch))
        cluster = dataclasses.replace(cluster, devices=devices,
                                      network=dataclasses.replace(cl.network, latency_s=e.allreduce_latency_s / 2))
    return dataclasses.replace(problem, cluster=cluster, job=job, dynamics=dynamics)


def teacher_layer(model: Model) -> Layer:
    """A parameter-free leading layer that stands for labelling the batch (priced by a table).

    Its output size is the model's input size, so the first real layer's input
    bytes are unchanged; its signature (a GEMM of 0 FLOPs) is one no real layer has.
    """
    return Layer(TEACHER, "gemm", 0.0, 0.0, 0.0, model.input_bytes, kernels=1)


def with_teacher(model: Model) -> Model:
    """``model`` with :func:`teacher_layer` in front."""
    return dataclasses.replace(model, layers=(teacher_layer(model), *model.layers))


def _teacher_profile(dev: Device, model: Model, dtype: str, max_batch: int) -> Device:
    """``dev`` whose profile prices the teacher layer: the student's forward at every batch
    from 1 to ``max_batch``."""
    sig = costmodel.table_key(teacher_layer(model), model.input_bytes)
    tables = dict(dev.type.layers or {})
    if sig in tables:  # never silently reuse a measured table
        raise ConfigError("<validate>", "job.model", f"layer signature {sig} already measured")
    batch = list(range(1, max_batch + 1))
    fwd = [float(costmodel.layer_times(model, dev.type, dtype, b)[0].sum()) for b in batch]
    tables[sig] = LayerTable(batch=batch, fwd_s=fwd, bwd_s=[0.0] * len(batch))
    return dataclasses.replace(dev, type=dev.type.model_copy(update={"layers": tables}))
