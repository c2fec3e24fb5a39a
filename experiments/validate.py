"""`hetsim validate CONFIG`: the calibrated DES against a real run of the same plan.

For each scheduler: plan once, simulate the plan with the DES and execute the
same plan with the runtime (:mod:`runtime`), then compare metric by metric
(:data:`METRICS`): simulated value, real value, relative error
``(sim - real) / real``. With several schedulers, whether the DES ranks them
as the real runs do (:func:`ranking_preserved`).

What the simulator is given, so that it models what the runtime executes:

* **The exact model.** The runtime trains ``sim.zoo.torch_module(name,
  **runtime.model_kwargs)``; the zoo's committed layer list is the default
  size. The simulated model is extracted with :func:`sim.torch_extract.from_torch`
  from the very module the workers build (:func:`runtime.task.build`), with
  embedding tables dense (the runtime moves whole tensors, not touched rows).
* **The teacher.** Every real iteration a worker first labels its fresh batch
  with a forward pass of the teacher (same architecture, no grad;
  :class:`runtime.task.Teacher`). The simulated model gets a leading
  parameter-free layer ``teacher`` whose forward time is the cost model's
  forward time of the student on the same batch (the architectures are equal),
  entered as a per-layer table of each worker's profile, and no backward.
* **Emulated slowdowns.** ``runtime.workers[i].slowdown`` sleeps ``(f - 1) x``
  the forward/backward time (not the teacher's); the DES gets a slowdown from
  t = 0 of ``(T + f S) / (T + S)`` over its whole compute (T teacher, S
  student at the worker's planned share), the same seconds (on a host, a sleep
  of ``(factor - 1) x`` the elapsed compute, as the runtime does it).
* **The host.** Every rank runs on this machine, so (unless the config has its
  own ``cluster.hosts``) the DES gets one host, :func:`calibration.host.measure_host`: the
  cores this process may use, and as background the load of other jobs
  measured by a 1-second probe just before the run (:func:`calibration.host.background_threads`); each worker
  is a process on it with ``runtime.workers[i].threads`` (default
  ``runtime.threads``) and ``affinity``, each PS shard one with
  ``runtime.threads`` and ``runtime.ps_affinity`` (absent: not pinned). Messages
  between the ranks are the runtime's loopback path on these cores: where the
  profile measured it (``network.wire_pull_Bps`` / ``wire_push_Bps``,
  :func:`calibration.profiler.wire_bench`), every process's link and the
  host's ``copy_Bps`` (each end's share of a message, on its cores) are the
  rate of one pull and one push (:func:`wire_rate_Bps`), so a message is as
  fast as measured when both ends have a core and as slow as the end with
  the smaller share when they do not; otherwise ``copy_Bps`` is the profile's
  gloo point-to-point bandwidth (``network.p2p_bw_Bps``) and the links are
  the config's. The lowest over the ranks' profiles. The emulation has
  ``serial_messages``: a rank sends one message at a time and a shard
  receives one at a time and answers pulls in turn, as the runtime's blocking
  sends and single receiver thread do. Its
  ``wake_s`` is the profile's ``network.wake_latency_s`` (the lowest over the
  ranks' profiles; :func:`calibration.profiler.wake_bench`): a message
  that arrives while every core is busy reaches its rank that much later. The report
  records what was assumed (``info["host"]``) and, per scheduler, the DES's
  prediction without the host (``diagnostics["sim_without_host"]``) and with
  the host but messages that cost no CPU (``diagnostics["sim_without_copies"]``).

All of this is one :class:`sim.emulation.RuntimeEmulation` (:func:`emulation`), handed
to the evaluators beside the problem; the config's problem itself is unchanged.

**The profile.** Every rank is priced with its config's profile (the validation
configs: ``this_machine``, measured on one machine), or with ``fresh_profile``
(``hetsim validate --fresh-profile FILE``) with this machine's, measured now into
FILE or reused from it (:mod:`calibration.fresh_profile`).

**The headline** (:mod:`experiments.validate_headline`): beside the mean iteration
time's error, the median |error| over every per-worker compute and communication
metric, the calibrated models of this machine the DES used (the runtime CPU
model) and the error without them; in report.md, validation.json (``headline``)
and on ``hetsim validate``'s output.

Warm-up: every metric leaves out the first ``job.warmup_iterations``
iterations on both sides (RunResult's iteration statistics already do; the
per-worker times are taken from the traces over the same window).

Per-worker times, per measured iteration (seconds), from each side's trace:

* ``compute_s``: drawing and labelling the batch plus forward and backward
  (DES: the ``fwd``/``bwd`` spans, and with ``job.pipeline`` the ``quant`` spans, as
  the runtime's sender thread packs during the backward; runtime: from the end of the last pull to
  the end of the ``compute`` span, which covers the teacher's forward).
* ``comm_s``: time during which the worker has a transfer of its own in
  flight, the union of its pull and push intervals (DES: its network spans and,
  without ``job.pipeline``, its gradient's quantization, the ``quant`` spans, which
  the runtime does inside its push; a pull queued behind another at its shard is waiting, as the
  runtime's pull span begins when the shard starts to answer it;
  runtime: its ``pull`` and ``push`` spans and, pipelined, its sender
  thread's spans, and with pipelined pulls its receiver thread's). Waiting
  for others (the barrier) is in neither. With pipelined pulls the runtime's
  ``compute`` span also holds forward's waits for parameters.

``time_to_target_s`` (configs with ``job.target_loss``): DES from the
convergence model; runtime: the end of the first iteration at which the mean
measured loss of the last :data:`LOSS_WINDOW` iterations is at or below the
target.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import schedulers
from calibration import model_variants, runtime_cpu
from calibration.fresh_profile import fresh_profile as fresh_profile_of
from calibration.host import host_cores, measure_host, memory_factor, standalone_compute_s
from calibration.speed_now import around, speed_now, with_drift
from experiments import run as entry
from experiments import runner
from experiments.plots import markdown_table
from experiments.validate_headline import headline, headline_text, pct
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from hardware_profiles.schema import DeviceProfile
from runtime.launch import run_local
from runtime.spec import RunSpec, RuntimeOptions, build_spec, parse_options
from sim import costmodel, zoo
from sim.cluster import Host, Placement
from sim.emulation import RuntimeEmulation, emulated_problem
from sim.overrides import overriding, registered
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult
from sim.workload import Model

#: Metrics compared for every scheduler; per-worker ones get ``:DEVICE`` appended.
METRICS = ("iteration_time_mean_s", "iteration_time_p50_s", "throughput_sps", "compute_s",
           "comm_s", "time_to_target_s")
PER_WORKER = ("compute_s", "comm_s")
#: Iterations averaged when reading the real time to target off the noisy measured loss.
LOSS_WINDOW = 5
#: Two values closer than this (relative) are a tie when ranking schedulers.
TIE_REL = 0.05
VALIDATION_SCHEMA = 1


# ------------------------------------------------------------------ arithmetic
def rel_error(sim: float | None, real: float | None) -> float | None:
    """``(sim - real) / real``; None when either is missing or not finite, or real is 0."""
    if sim is None or real is None or not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return None
    return (sim - real) / real


def _tie(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


def ranking_preserved(sim: dict[str, float], real: dict[str, float], tie_rel: float = TIE_REL) -> bool | None:
    """Whether the simulated values order the schedulers as the real ones do.

    A pair of schedulers contradicts the ranking when both sides order it
    strictly and in opposite ways; values within ``tie_rel`` of each other
    (relative) are a tie on that side and contradict nothing, because a
    difference below the measurement noise ranks nothing. None with fewer than
    two schedulers present on both sides.
    """
    names = [n for n in sim if n in real]
    if len(names) < 2:
        return None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _tie(sim[a], sim[b], tie_rel) or _tie(real[a], real[b], tie_rel):
                continue
            if (sim[a] < sim[b]) != (real[a] < real[b]):
                return False
    return True


def compare(sim: dict[str, float | None], real: dict[str, float | None]) -> dict[str, dict[str, float | None]]:
    """{metric: {sim, real, rel_error}} over the metrics either side has, in ``sim``'s order."""
    keys = list(sim) + [k for k in real if k not in sim]
    return {k: {"sim": sim.get(k), "real": real.get(k), "rel_error": rel_error(sim.get(k), real.get(k))}
            for k in keys}


# -------------------------------------------------------------- trace reading
def _window(result: RunResult) -> tuple[float, float, int]:
    """(start, end, iterations) of the measured (post-warm-up) iterations."""
    ends = result.iter_end_s
    n = len(ends)
    w = result.warmup if n > result.warmup else 0
    return (ends[w - 1] if w > 0 else 0.0), (ends[-1] if ends else 0.0), n - w


def _union_in(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to [lo, hi]."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None and cur_b is not None:
        total += cur_b - cur_a
    return total


def worker_intervals(trace: list[dict[str, Any]], quant_in_push: bool = True
                     ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{device: {"compute": [...], "comm": [...]}} in seconds, from a DES or runtime trace.

    The DES's ``quant`` spans (a gradient's quantization) count as communication where
    ``quant_in_push`` (the runtime packs a gradient inside its push), else as compute
    (pipelined pushes: its sender thread packs during the backward, on the same cores,
    inside the ``compute`` span).

    Both write the same tracks (:class:`sim.result.Trace`): ``workers`` (pid 0)
    with one thread per worker named by its device, ``network`` (pid 1) with
    the worker's messages (DES) or its sender thread ``DEVICE sender``
    (runtime, pipelined) and receiver thread ``DEVICE receiver`` (runtime,
    ``runtime.pipeline_pulls``).
    """
    names: dict[tuple[int, int], str] = {}
    for e in trace:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = str(e["args"]["name"]).removesuffix(" sender").removesuffix(" receiver")
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    per_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    opened: dict[tuple[int, int, int], float] = {}
    for e in trace:
        key = (e.get("pid", -1), e.get("tid", -1))
        if e.get("ph") == "X":
            per_thread.setdefault(key, []).append((e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6, e["name"]))
        elif e.get("ph") == "b":
            opened[(*key, e["id"])] = e["ts"] * 1e-6
        elif e.get("ph") == "e":
            a = opened.pop((*key, e["id"]), None)
            if a is not None:
                per_thread.setdefault(key, []).append((a, e["ts"] * 1e-6, e["name"]))
    for key, spans in per_thread.items():
        dev = names.get(key)
        if dev is None or key[0] not in (0, 1):
            continue
        d = out.setdefault(dev, {"compute": [], "comm": []})
        spans.sort()
        if key[0] == 1:  # network track: every span is a transfer of this worker
            d["comm"] += [(a, b) for a, b, _ in spans]
            continue
        prev_end: float | None = None
        prev_name = ""
        for a, b, name in spans:
            if name.startswith(("fwd", "bwd")):
                d["compute"].append((a, b))
            elif name.startswith("quant"):
                d["comm" if quant_in_push else "compute"].append((a, b))
            elif name == "compute":
                # the runtime draws and labels the batch (teacher forward) between the last
                # pull and the timed forward/backward; the DES models it as compute
                start = prev_end if prev_name == "pull" and prev_end is not None else a
                d["compute"].append((start, b))
            elif name in ("pull", "push"):
                d["comm"].append((a, b))
            prev_end, prev_name = b, name
    return out


def measured_metrics(result: RunResult, target_loss: float | None = None,
                     pipeline: bool = False) -> dict[str, float | None]:
    """The compared metrics of one run (DES or runtime), warm-up excluded (``pipeline``:
    the job's, where the quantization is counted: :func:`worker_intervals`)."""
    s = result.summary()
    m: dict[str, float | None] = {
        "iteration_time_mean_s": s["iteration_time_s"]["mean"],
        "iteration_time_p50_s": s["iteration_time_s"]["p50"],
        "throughput_sps": s["throughput_sps"],
    }
    lo, hi, n = _window(result)
    spans = worker_intervals(result.trace, quant_in_push=not pipeline)
    for kind in PER_WORKER:
        for d in result.devices:
            if d.role != "worker":
                continue
            iv = spans.get(d.id, {}).get(kind.removesuffix("_s"), [])
            m[f"{kind}:{d.id}"] = _union_in(iv, lo, hi) / n if n > 0 else None
    if target_loss is not None:
        m["time_to_target_s"] = (result.time_to_target_s if result.evaluator != "runtime"
                                 else real_time_to_target(result, target_loss))
    return m


def real_time_to_target(result: RunResult, target: float) -> float | None:
    """End of the first iteration whose mean loss over the last :data:`LOSS_WINDOW` iterations
    (a full window: one lucky early batch is not the target reached) is <= target."""
    loss = result.iter_loss or []
    for i in range(LOSS_WINDOW - 1, len(loss)):
        window = [x for x in loss[i - LOSS_WINDOW + 1: i + 1] if math.isfinite(x)]
        if window and sum(window) / len(window) <= target:
            return float(result.iter_end_s[i])
    return None


# ------------------------------------------------------- the simulated problem
def exact_model(spec_model: str, seed: int, model_kwargs: dict[str, Any]) -> Model:
    """The layer list of the module the runtime's workers train (same builder, sizes and seed).

    Embedding tables are made dense: the runtime pulls and pushes whole tensors
    (sparse, touched-rows-only transfers are not built there), so the DES must
    move whole tables too.
    """
    from runtime import task
    from sim.torch_extract import from_torch

    module, example = task.build(spec_model, seed, model_kwargs)
    model = from_torch(module.train(), example, name=spec_model)
    return dataclasses.replace(model, layers=tuple(dataclasses.replace(ly, sparse=None) for ly in model.layers))


def emulation(problem: Problem, plan: Plan, opts: RuntimeOptions, host: Host | None = None) -> RuntimeEmulation:
    """The runtime executing ``plan`` of ``problem`` (which holds the exact model) with ``opts``,
    as the simulated side models it: the teacher's forward, ``runtime.workers`` slowdowns
    from t = 0 (:func:`runtime_slowdowns`), pulls as the runtime makes them
    (``runtime.pipeline_pulls``) and, with ``host``, every rank on it (:func:`on_host`)."""
    emu = RuntimeEmulation(teacher=True, pipeline_pulls=opts.pipeline_pulls,
                           slowdowns=runtime_slowdowns(problem, plan, opts))
    return on_host(emu, problem, plan, opts, host) if host is not None else emu


def runtime_slowdowns(problem: Problem, plan: Plan, opts: RuntimeOptions) -> tuple[tuple[str, float], ...]:
    """Per worker of ``plan`` whose ``runtime.workers[i].slowdown`` f is not 1, the slowdown
    of its whole compute from t = 0 that adds the seconds the runtime sleeps, ``(T + f S) /
    (T + S)`` (T: the teacher's forward, S: the student's forward and backward at its share),
    because the runtime sleeps ``(f - 1) x`` the student's compute only."""
    job, model = problem.job, problem.job.model
    shares = {r.device: r.batch for r in plan.replicas}
    out = []
    for w, o in enumerate(opts.workers):
        if o.slowdown == 1.0 or w >= len(plan.replicas):
            continue
        dev = problem.cluster.device(plan.replicas[w].device)
        f, bw = costmodel.layer_times(model, dev.type, job.dtype, max(shares[dev.id], 1))
        student, teacher = float(f.sum() + bw.sum()), float(f.sum())
        out.append((dev.id, (teacher + o.slowdown * student) / (teacher + student)))
    return tuple(out)


def on_host(emu: RuntimeEmulation, problem: Problem, plan: Plan, opts: RuntimeOptions,
            host: Host) -> RuntimeEmulation:
    """``emu`` with every rank of the real run on ``host``: each worker of ``plan`` a process
    with its ``runtime.workers`` threads and affinity, each shard one with ``runtime.threads``
    and ``runtime.ps_affinity``; the runtime's loopback messages (see below) one at a time
    per rank; an all-reduce plan's ring at the ranks' measured all-reduce (the slowest
    profile's ``network.allreduce_bw_Bps`` and its ``allreduce_latency_s``, where measured).
    A problem that has hosts already keeps them: ``emu`` is returned as it is."""
    cl = problem.cluster
    if cl.hosts:
        return emu
    placement = []
    for w, r in enumerate(plan.replicas):
        o = opts.workers[w] if w < len(opts.workers) else None
        threads = (o.threads if o is not None and o.threads else opts.threads)
        placement.append((r.device, Placement(0, threads, host_cores(o.affinity if o is not None else None))))
    ps_cores = host_cores(opts.ps_affinity)
    placement += [(s, Placement(0, opts.threads, ps_cores)) for s in plan.ps_shards]
    # the ranks' measured network figures; each host field the lowest of them where unset
    nets = [n for d in (*(r.device for r in plan.replicas), *plan.ps_shards)
            if (n := cl.device(d).type.network) is not None]

    def lowest(measured: str) -> float:
        return float(min((v for n in nets if (v := getattr(n, measured, None))), default=0.0))

    # Every rank on this host: no message touches a NIC. Each is the runtime's loopback path
    # (runtime.wire over gloo's TCP): the sender packs and writes into the socket while the
    # receiver reads out of it and unpacks, so both ends work on the message for its whole
    # duration, and it goes at the pace of the slower end. Where the profile measured that
    # path (wire_bench), each end's share (copy_Bps) and the link run at its rate alone
    # (wire_rate_Bps): as fast as measured when both ends have a core, as slow as the end
    # with the smaller share of one when they do not (docs/notes/2026-12-07-validation-headline.md
    # compares this with charging each end only its CPU). The cost: an end counts as runnable for the whole
    # message while it uses only part of a core. Without those figures: gloo's bare p2p
    # bandwidth for the copies and the NICs as given.
    rate = wire_rate_Bps(nets)
    # An all-reduce plan's ring: the profile's own measurement of gloo's all-reduce of two
    # processes on this machine (its reduction and chunking included), not the loopback
    # messages' rate (sim.emulation.RuntimeEmulation.allreduce_Bps)
    measured = [(bw, lat) for n in nets if (bw := getattr(n, "allreduce_bw_Bps", None))
                and (lat := getattr(n, "allreduce_latency_s", None)) is not None]
    ar_Bps, ar_lat = min(measured, default=(0.0, 0.0)) if problem.job.sync == "allreduce" else (0.0, 0.0)
    host = dataclasses.replace(host, copy_Bps=host.copy_Bps if host.copy_Bps > 0 else (rate or lowest("p2p_bw_Bps")),
                               wake_s=host.wake_s if host.wake_s > 0 else lowest("wake_latency_s"))
    # the runtime's ranks send with blocking sends from one thread and a shard receives with
    # one thread and answers pulls in turn from its main thread: messages go one at a time
    return dataclasses.replace(emu, host=host, placement=tuple(placement), wire_Bps=rate, serial_messages=True,
                               allreduce_latency_s=float(ar_lat), allreduce_Bps=float(ar_Bps))


def wire_rate_Bps(nets: Sequence[Any]) -> float:
    """The bandwidth of a process's link when every rank runs on this host: the rate at which
    the runtime moves one pull and one push of the same bytes, ``2 / (1 / pull + 1 / push)``
    with the profile's ``wire_pull_Bps`` and ``wire_push_Bps`` (the lowest over ``nets``,
    the ranks' profiles' network measurements); 0 where a profile lacks them.

    The DES gives a process one link bandwidth for both directions, while the runtime's
    pushes and pulls differ per byte (a fp32 push is concatenated once at the worker, a
    pull copied into the parameters): the rate of the pair is exact for a fp32 iteration,
    which moves the same bytes each way. A quantized push packs into a new buffer instead
    (its pack is priced on its own, ``quant``), so with quantization the pulls are priced
    at the pair's rate.
    """
    pulls = [v for n in nets if (v := getattr(n, "wire_pull_Bps", None))]
    pushes = [v for n in nets if (v := getattr(n, "wire_push_Bps", None))]
    if not pulls or not pushes or len(pulls) < len(nets) or len(pushes) < len(nets):
        return 0.0
    pull, push = float(min(pulls)), float(min(pushes))
    return 2.0 / (1.0 / pull + 1.0 / push)


def with_compute_scaled(problem: Problem, emu: RuntimeEmulation, factors: dict[str, float]) -> RuntimeEmulation:
    """``emu`` with each worker's compute from t = 0 multiplied by ``factors[device]`` (on top
    of the t = 0 slowdown it already has, the emulation's or else the problem's; later events
    are kept as they are).

    A diagnostic, not a model: given the compute times measured in the real run, what
    is left of the error is the transfers, the PS and the waits.
    """
    ids = [d.id for d in problem.cluster.devices]
    start = {ids[d.worker]: d.slowdown for d in problem.dynamics if d.at_s == 0.0 and d.slowdown is not None}
    start.update(emu.slowdowns)
    new = [(dev, f * (start.get(dev) or 1.0)) for dev, f in factors.items()]
    keep = [(dev, s) for dev, s in emu.slowdowns if dev not in factors]
    return dataclasses.replace(emu, slowdowns=(*new, *keep))


def with_cpu_scaled(emu: RuntimeEmulation, factors: dict[str, float]) -> RuntimeEmulation:
    """``emu`` with each hosted process's CPU multiplied by ``factors[device]`` (its compute
    or a shard's work and its messages' copies alike:
    :attr:`sim.emulation.CpuScale.compute`).

    A diagnostic, not a model: given the CPU each rank used in the real run, what is left
    of the error is how the DES shares the cores and orders the work, and the waits.
    """
    return emu.scaled({dev: (f, 1.0) for dev, f in factors.items()})


def without_copies(emu: RuntimeEmulation) -> RuntimeEmulation:
    """``emu`` with the hosts' messages free of CPU, as before copies were charged."""
    return dataclasses.replace(emu, message_copies=False)


def cpu_control_s(cpu: dict[str, Any] | None) -> float | None:
    """A control for the rerun with real CPU, without any rerun: the real run's CPU per
    iteration over the cores the DES kept busy, as an iteration time in seconds (None
    without :func:`cpu_per_iteration`'s figures)."""
    if not cpu or not cpu["sim_cores_busy"]:
        return None
    return 1e-3 * cpu["real_total_ms"] / cpu["sim_cores_busy"]


def real_cpu_factors(cpu: dict[str, Any] | None) -> dict[str, float]:
    """Per process, the real run's CPU over the DES's (compute and transport together),
    from :func:`cpu_per_iteration` ({} without its figures)."""
    if not cpu:
        return {}
    return {dev: p["real_ms"] / sim for dev, p in cpu["processes"].items()
            if p["sim_ms"] is not None and (sim := p["sim_ms"] + p["sim_transport_ms"]) > 0}


# ------------------------------------------------------------------ one config
@dataclass
class SchedulerRun:
    """Sim and real of one scheduler on one config."""

    scheduler: str
    metrics: dict[str, dict[str, float | None]]
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Validation:
    """The outcome of :func:`validate` on one config."""

    config: str
    name: str
    runs: list[SchedulerRun]
    ranking_preserved: bool | None
    info: dict[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        """validation.csv rows: config, scheduler, metric, sim, real, rel_error."""
        return [{"config": self.name, "scheduler": r.scheduler, "metric": k, **v}
                for r in self.runs for k, v in r.metrics.items()]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Validation:
        """The inverse of :meth:`to_json` (to rebuild reports from validation.json)."""
        runs = [SchedulerRun(n, r["metrics"], r.get("diagnostics", {})) for n, r in d["schedulers"].items()]
        return cls(d["config"], d["name"], runs, d["ranking_preserved"], d.get("info", {}))

    def to_json(self) -> dict[str, Any]:
        return {"schema": VALIDATION_SCHEMA, "config": self.config, "name": self.name,
                "ranking_preserved": self.ranking_preserved, "info": self.info,
                "schedulers": {r.scheduler: {"headline": headline(r.metrics, r.diagnostics),
                                             "metrics": r.metrics, "diagnostics": r.diagnostics}
                               for r in self.runs}}


def cpu_per_iteration(sim: RunResult, real: RunResult) -> dict[str, Any] | None:
    """Where the CPU goes, per process and per iteration (ms), in the DES and in the real run:
    the DES's CPU given to each hosted process (its compute and a shard's work) and apart
    to its transport (its messages' copies); the runtime's CPU of each process over its
    loop (every thread), of its gloo transport threads (``gloo_tcp_loop``) and, for a
    worker, of its main thread in forward and backward. Every figure is per global
    iteration of its side (in ASP/SSP a rank's part of those iterations may differ
    between the sides). A process's real CPU in all (``real_ms``) is over its whole
    loop, start-up and warm-up included, as the runtime CPU model is fitted to it;
    ``real_window_ms`` is over the iterations after the warm-up only (the runtime's
    ``window``; None where not measured), as the iteration times are (docs/guides/validation.md:
    why the model is fitted to the whole loop). ``cores_busy``: all
    processes' CPU over the run's wall time. None when either side lacks the figures (a DES without hosts, an older run, a rank
    that sent no final report, e.g. a failed worker); a rank the DES did not place on
    the host is listed with no simulated CPU and left out of both totals."""
    s_cpu = sim.extra.get("host_cpu_s")
    r_cpu = real.extra.get("runtime", {}).get("cpu")
    n_sim, n_real = len(sim.iter_end_s), len(real.iter_end_s)
    if not s_cpu or not r_cpu or not n_sim or not n_real or any(v is None for v in r_cpu.values()):
        return None
    role = {d.id: d.role for d in real.devices}
    rows: dict[str, dict[str, Any]] = {}
    for proc, got in r_cpu.items():
        threads = got.get("threads_cpu_s") or {}
        comp = got.get("compute_cpu_s")
        placed = proc in s_cpu
        rows[proc] = {"role": role.get(proc), "sim_ms": 1e3 * s_cpu[proc] / n_sim if placed else None,
                      "sim_transport_ms": 1e3 * s_cpu.get(f"{proc} transport", 0.0) / n_sim if placed else None,
                      "real_ms": 1e3 * got["cpu_s"] / n_real,
                      "real_window_ms": (1e3 * win["cpu_s"] / win["iterations"] if (win := got.get("window"))
                                         else None),
                      "real_transport_ms": 1e3 * threads["gloo_tcp_loop"] / n_real if "gloo_tcp_loop" in threads
                      else None,
                      "real_compute_ms": None if comp is None else 1e3 * comp / n_real}
    both = [r for r in rows.values() if r["sim_ms"] is not None]
    sim_total = sum(r["sim_ms"] + r["sim_transport_ms"] for r in both)
    real_total = sum(r["real_ms"] for r in both)
    real_wall = max(got["wall_s"] for got in r_cpu.values())
    return {"processes": rows, "sim_total_ms": sim_total, "real_total_ms": real_total,
            "sim_cores_busy": 1e-3 * sim_total * n_sim / sim.iter_end_s[-1],
            "real_cores_busy": 1e-3 * real_total * n_real / real_wall if real_wall > 0 else None}


def scheduler_names(arg: str | None, default: str, source: str = "<command line>") -> list[str]:
    """``--schedulers a,b`` checked against the registry (default: the config's scheduler)."""
    names = [n for n in (arg.split(",") if arg else [default]) if n]
    known = schedulers.names()
    for n in names:
        if n not in known:
            raise ConfigError(source, "--schedulers" if arg else "scheduler.name",
                              f"unknown scheduler {n!r}; known: {', '.join(known)}")
    if not names:
        raise ConfigError(source, "--schedulers", "no scheduler given")
    return names




def _host_info(problem: Problem, plan: Plan, n_workers: int, n_shards: int, loadavg_1min: float) -> dict[str, Any]:
    """What the DES assumed about the machine (``problem`` as simulated), with the 1-minute
    load average probed before the real runs."""
    cl = problem.cluster
    host = cl.hosts[0] if cl.hosts else measure_host()
    placed = [cl.placed(r.device) for r in plan.replicas]
    threads = [pl.threads if pl is not None else 1 for pl in placed]
    return {"cores": host.cores, "workers": n_workers, "shards": n_shards,
            "worker_threads": sum(threads), "processes": n_workers + n_shards,
            "oversubscribed": sum(threads) > host.cores,
            "affinity": [list(pl.affinity) if pl is not None and pl.affinity is not None else None
                         for pl in placed],
            "host": {"name": host.name, "cores": host.cores, "background_threads": host.background_threads,
                     "loadavg_1min": loadavg_1min, "hosts": len(cl.hosts),
                     "placement": {dev: dataclasses.asdict(pl) for dev, pl in cl.placement}}}


def load(config: str | Path, iterations: int | None = None, profile: DeviceProfile | None = None
         ) -> tuple[Any, runner.Loaded, RuntimeOptions, Problem]:
    """A validation config read as :func:`validate` reads it: ``(config, loaded,
    runtime options, problem)``, the problem holding the exact model the runtime trains
    (:func:`exact_model`), ``iterations`` (if given) in place of ``job.iterations`` and
    ``profile`` (if given: this machine's, :func:`with_profile`) in place of every rank's.

    Raises:
        ConfigError: bad config, runtime section or ``iterations`` (one line).
    """
    source = str(config)
    cfg, runtime_raw = entry.read_config(config)
    loaded = runner.Loaded(cfg, Path(config).resolve().parent, source)
    opts = parse_options(runtime_raw, source)
    if iterations is not None and iterations <= 0:
        raise ConfigError("<command line>", "--iterations", f"must be > 0, got {iterations}")
    base = runner.problem_of(loaded)
    if profile is not None:
        base = with_profile(base, profile)
    if iterations is not None:
        base = dataclasses.replace(base, job=dataclasses.replace(
            base.job, iterations=iterations,
            warmup_iterations=min(base.job.warmup_iterations, max(iterations - 1, 0))))
    if base.job.model.name not in zoo.names():
        raise ConfigError(source, "job.model", f"the runtime trains zoo models only "
                          f"({', '.join(zoo.names())}), not {base.job.model.name!r}")
    model = exact_model(base.job.model.name, base.seed, opts.model_kwargs)
    return cfg, loaded, opts, dataclasses.replace(base, job=dataclasses.replace(base.job, model=model))


def with_profile(problem: Problem, profile: DeviceProfile) -> Problem:
    """``problem`` with ``profile`` the type of every device and shard: every rank of the
    real run is a process on this machine, so this machine's profile prices them all."""
    cl = problem.cluster
    devices = tuple(dataclasses.replace(d, type=profile) for d in cl.devices)
    shards = tuple(dataclasses.replace(d, type=profile) for d in cl.shards)
    return dataclasses.replace(problem, cluster=dataclasses.replace(cl, devices=devices, shards=shards))


def profiles_used(problem: Problem, fresh: Path | None = None) -> dict[str, str]:
    """Each profile that prices a rank of ``problem``: where its figures come from (the
    headline's ``profiles``; ``fresh``: the file of ``--fresh-profile``)."""
    out = {}
    for d in (*problem.cluster.devices, *problem.cluster.shards):
        src = d.type.source
        what = f"{src.kind}" + (f" {src.date}" if src.date else "")
        device = getattr(src, "device", None)
        out[d.type.name] = what + (f" on {device}" if device else "") + (f", --fresh-profile {fresh}" if fresh else "")
    return out


#: the validation suite's configs, whose models a fresh profile times
SUITE_DIR = Path(__file__).resolve().parent / "configs" / "validation"


def fresh_models(configs: Sequence[Path]) -> dict[str, tuple[int, ...]]:
    """What a fresh profile times per layer for validating ``configs``: each config's model as
    the runtime builds it (a :mod:`calibration.model_variants` label with its
    ``runtime.model_kwargs``) at half, once and twice its equal batch share per worker
    (``job.global_batch`` over the workers), the batches of one model merged; a model
    named by a file, not the zoo, is left out (the fitted curves price it).

    Raises:
        ConfigError: a config that cannot be read (one line).
    """
    out: dict[str, set[int]] = {}
    for c in configs:
        cfg, runtime_raw = entry.read_config(c)
        if not isinstance(cfg.job.model, str) or cfg.job.model not in zoo.names():
            continue
        key = model_variants.label(cfg.job.model, parse_options(runtime_raw, str(c)).model_kwargs)
        share = max(1, cfg.job.global_batch // max(1, sum(d.count for d in cfg.cluster.devices)))
        out.setdefault(key, set()).update({max(1, share // 2), share, 2 * share})
    return {k: tuple(sorted(v)) for k, v in out.items()}


def des_again(loaded: runner.Loaded, problem: Problem, scheduler: str, emu: RuntimeEmulation | None, plan: Plan,
              trace: bool = False) -> RunResult:
    """The DES of ``problem`` under the emulation ``emu`` (the simulated side's or a variant
    of it: a CPU model, no host, the real compute...) on ``plan``, under a scheduler object
    of its own (an online one keeps state while it rebalances, so each run gets a fresh one)."""
    sched, _ = runner.schedule(loaded, problem, scheduler)
    return runner.evaluate(problem, plan, "des", trace=trace, scheduler=sched, emulation=emu)


@dataclass(frozen=True)
class _FirstDes:
    """What :func:`validate` simulates first: the problem and plan, the emulation on the
    host, the problem as the evaluators then run it (:func:`sim.emulation.emulated_problem`)
    and the DES result."""

    loaded: runner.Loaded
    opts: RuntimeOptions
    problem: Problem
    plan: Plan
    emu: RuntimeEmulation
    simulated: Problem
    result: RunResult


def _first_des(config: str | Path, scheduler: str, host: Host, iterations: int | None,
               profile: DeviceProfile | None = None, trace: bool = False,
               drift: dict[str, Any] | None = None) -> _FirstDes:
    """:class:`_FirstDes` of ``config`` under ``scheduler`` on ``host``, without the real run
    (``profile``: this machine's in place of every rank's, as :func:`load`; ``drift``: the
    speed factors a run recorded, :mod:`calibration.speed_now`)."""
    _, loaded, opts, problem = load(config, iterations, profile)
    sched, plan = runner.schedule(loaded, problem, scheduler)
    emu = emulation(problem, plan, opts, host)
    if drift is not None:
        emu = with_drift(emu, drift["compute"])
    first = runner.evaluate(problem, plan, "des", trace=trace, scheduler=sched, emulation=emu)
    return _FirstDes(loaded, opts, problem, plan, emu, emulated_problem(problem, emu), first)


def rescore(v: Validation, profile: DeviceProfile | None = None) -> Validation:
    """``v`` with its simulated side again and its real side as recorded: each run's DES
    (with the runtime CPU model of the profiles, as :func:`validate`) on a host of the run's
    cores and recorded background load, its metrics compared with the recorded real ones.
    For working on the DES without rerunning the real side; ``diagnostics`` stay as
    recorded (they describe the DES that ran then). ``profile``: the ``--fresh-profile``
    the runs were priced with, if any. The config is read with the ``--set`` overrides
    it ran with (``info["overrides"]``)."""
    with overriding([v.config], _recorded_sets(v)):
        return _rescore(v, profile)


def _recorded_sets(v: Validation) -> list[str]:
    """The ``--set`` overrides ``v`` ran with (``info["overrides"]``), as given on the command line."""
    return [f"{k}={json.dumps(x)}" for k, x in v.info.get("overrides", [])]


def _first_des_again(v: Validation, r: SchedulerRun, profile: DeviceProfile | None,
                     trace: bool = False) -> _FirstDes:
    """:func:`_first_des` of run ``r`` of ``v`` on its recorded host, background load and
    drift (the config read with ``v``'s overrides: call it inside :func:`overriding`)."""
    h = r.diagnostics["host"]
    return _first_des(v.config, r.scheduler, Host("local", h["cores"], h["background_threads"]), None,
                      profile, trace=trace, drift=r.diagnostics.get("drift"))


def _rescore(v: Validation, profile: DeviceProfile | None) -> Validation:
    runs = []
    for r in v.runs:
        f = _first_des_again(v, r, profile, trace=True)
        scales = runtime_cpu.scales_for(f.simulated, runtime_cpu.figures(f.simulated, f.result))
        sim = (des_again(f.loaded, f.problem, r.scheduler, f.emu.scaled(scales), f.plan, trace=True)
               if scales else f.result)
        real = {k: m["real"] for k, m in r.metrics.items()}
        runs.append(SchedulerRun(r.scheduler, compare(measured_metrics(sim, f.problem.job.target_loss, f.problem.job.pipeline), real),
                                 r.diagnostics))
    ranked = ranking_preserved(
        {r.scheduler: x for r in runs if (x := r.metrics["iteration_time_mean_s"]["sim"]) is not None},
        {r.scheduler: x for r in runs if (x := r.metrics["iteration_time_mean_s"]["real"]) is not None})
    return Validation(v.config, v.name, runs, ranked, v.info)


def first_figures(v: Validation, profile: DeviceProfile | None = None) -> list[dict[str, runtime_cpu.Figures]]:
    """Per run of ``v``, the :func:`calibration.runtime_cpu.figures` of its first DES run
    again, with the DES as it is now (the run's host, background load, drift and ``--set``
    overrides as recorded; ``profile``: the ``--fresh-profile`` it was priced with): what
    a runtime CPU model is fitted to, after a change to the DES, without the real runs again."""
    out = []
    with overriding([v.config], _recorded_sets(v)):
        for r in v.runs:
            f = _first_des_again(v, r, profile)
            out.append(runtime_cpu.figures(f.simulated, f.result))
    return out


def resimulate(config: str | Path, scheduler: str, host: Host, models: dict[str, runtime_cpu.RuntimeCpuModel],
               iterations: int | None = None) -> dict[str, float]:
    """The simulated side of a validation again, without the real run: the DES's mean
    iteration time of ``config`` under ``scheduler`` on ``host`` (give it the background
    load the run recorded, its ``host`` diagnostics), as it is (key ``""``) and with
    each process's CPU predicted by each of ``models`` (their keys), as :func:`validate`
    does with the profile's model. Deterministic: with the run's host and the profile's
    model it gives the run's simulated figure again."""
    f = _first_des(config, scheduler, host, iterations)
    figs = runtime_cpu.figures(f.simulated, f.result)
    out = {"": f.result.summary()["iteration_time_s"]["mean"]}
    for key, m in models.items():
        out[key] = des_again(f.loaded, f.problem, scheduler, f.emu.scaled(m.scales(figs)),
                             f.plan).summary()["iteration_time_s"]["mean"]
    return out


def resimulate_figures(config: str | Path, scheduler: str, host: Host,
                       iterations: int | None = None) -> dict[str, float | None]:
    """The simulated figures of a validation run again, without the real run, on ``host``
    (the run's cores and recorded background load): the mean iteration time of the
    simulated side (``sim``: with each process's CPU from its profile's runtime CPU model
    where it has one, as :func:`validate`), of the DES before that model
    (``sim_without_model``, None where no profile has one), without the host
    (``sim_without_host``) and with the host but messages free of CPU
    (``sim_without_copies``), as in :func:`validate`'s diagnostics."""
    f = _first_des(config, scheduler, host, iterations)
    scales = runtime_cpu.scales_for(f.simulated, runtime_cpu.figures(f.simulated, f.result))
    sim = des_again(f.loaded, f.problem, scheduler, f.emu.scaled(scales), f.plan) if scales else f.result
    no_host = des_again(f.loaded, f.problem, scheduler, emulation(f.problem, f.plan, f.opts), f.plan)
    no_copy = des_again(f.loaded, f.problem, scheduler, without_copies(f.emu), f.plan)

    def mean(r: RunResult) -> float:
        return float(r.summary()["iteration_time_s"]["mean"])

    return {"sim": mean(sim), "sim_without_model": mean(f.result) if scales else None,
            "sim_without_host": mean(no_host), "sim_without_copies": mean(no_copy)}


class RealRuns(NamedTuple):
    """The real side of a validation run :func:`median_run` times over."""

    result: RunResult  # the run of median mean iteration time, the one compared
    wall_s: float  # its wall time
    means: list[float]  # every run's mean iteration time, in the order they ran
    chosen: int  # the index of ``result`` among them
    probes: list[Any]  # ``probe()`` before each run and after the last ([] without a probe)


def median_run(spec: RunSpec, repeats: int = 1, probe: Callable[[], Any] | None = None) -> RealRuns:
    """The real run ``repeats`` times over; the run whose mean iteration time is the median
    (of an even count, the upper of the middle two) is the one compared, and the spread of
    every run's mean is the real side's own noise. ``probe`` (the machine's speed now,
    :func:`calibration.speed_now.speed_now`) is called before each run and after the last.

    Raises:
        ConfigError: ``repeats`` < 1.
        runtime.launch.RuntimeFailure: a run failed.
    """
    if repeats < 1:
        raise ConfigError("<command line>", "--repeat", f"must be at least 1, got {repeats}")
    runs, probes = [], []
    for _ in range(repeats):
        if probe is not None:
            probes.append(probe())
        t0 = time.monotonic()
        r = run_local(spec)
        runs.append((r, time.monotonic() - t0))
    if probe is not None:
        probes.append(probe())
    means = [float(r.summary()["iteration_time_s"]["mean"] or 0.0) for r, _ in runs]
    k = sorted(range(repeats), key=means.__getitem__)[repeats // 2]
    return RealRuns(runs[k][0], runs[k][1], means, k, probes)


def validate(config: str | Path, scheduler_arg: str | None = None, iterations: int | None = None,
             out: Path | None = None, timeout_s: float = 600.0,
             on_step: Callable[[str], None] | None = None, fresh_profile: Path | None = None,
             repeats: int = 1) -> Validation:
    """Plan, simulate (DES) and run for real each scheduler of ``config``; compare.

    Args:
        config: a config YAML with a ``runtime:`` section (optional).
        scheduler_arg: comma-separated scheduler names (default: the config's).
        iterations: override ``job.iterations`` on both sides.
        out: write DIR/SCHEDULER/{sim,real}/ (the usual run files), report.md,
            validation.csv, validation.json and sim_vs_real.png here.
        timeout_s: wall-clock limit of each real run.
        on_step: called with a short label before each simulation and run (progress).
        fresh_profile: this machine's profile, in place of the config's for every rank:
            measured now into this file, or the file reused where it exists
            (:func:`calibration.fresh_profile.fresh_profile`).
        repeats: run the real side this many times and compare with the run of median
            mean iteration time (:func:`median_run`); every run's mean iteration time is
            kept (``diagnostics.real_repeats``).

    The real side runs first: with ``fresh_profile`` the machine's speed is probed before
    each real run and after the last, and the DES then runs at the median of those
    probes (:func:`calibration.speed_now.around`).

    Raises:
        ConfigError: bad config, runtime section, scheduler name or fresh profile (one line).
        runtime.launch.RuntimeFailure: a real run failed.
    """
    source = str(config)
    if repeats < 1:  # before anything is measured or run
        raise ConfigError("<command line>", "--repeat", f"must be at least 1, got {repeats}")
    machine = None
    if fresh_profile is not None:
        if on_step:
            on_step(f"profile: {fresh_profile}")
        threads = parse_options(entry.read_config(config)[1], source).threads
        machine, _ = fresh_profile_of(fresh_profile, threads, progress=on_step is not None,
                                      models=fresh_models([Path(config)]))
    cfg, loaded, opts, problem = load(config, iterations, machine)
    profiles = profiles_used(problem, fresh_profile)
    names = scheduler_names(scheduler_arg, cfg.scheduler.name)
    resolved = cfg.model_dump(mode="json")
    resolved["runtime"] = opts.model_dump(mode="json")
    runs: list[SchedulerRun] = []
    info: dict[str, Any] = {}
    for name in names:
        # one plan for both sides, made on the exact model; each side its own scheduler object
        # (an online scheduler keeps state while it rebalances)
        sched_sim, plan = runner.schedule(loaded, problem, name)
        sched_real, _ = runner.schedule(loaded, problem, name)
        spec = build_spec(problem, plan, opts, sched_real, problem.job.iterations, timeout_s, source)
        # how much slower memory copies run now than when the profile was measured
        mem = memory_factor(problem)
        # the runtime on this machine, as the DES is given it: the host probed now
        emu = emulation(problem, plan, opts, measure_host())
        shares = sorted({r.batch for r in plan.replicas})
        standalone = {b: standalone_compute_s(spec, b) for b in shares}
        if on_step:
            on_step(f"{name}: runtime")
        load_before = os.getloadavg()[0]
        # with a fresh profile (which timed the runtime's model), the machine's speed around
        # the real runs (calibration.speed_now), applied to the DES
        probe = (functools.partial(speed_now, problem, model_variants.label(problem.job.model.name, opts.model_kwargs),
                                   [b for b in shares if b > 0], opts.threads)
                 if fresh_profile is not None else None)
        real_runs = median_run(spec, repeats, probe)
        real, wall, repeats_s = real_runs.result, real_runs.wall_s, real_runs.means
        load_after = os.getloadavg()[0]
        drift = around(real_runs.probes)
        if drift is not None:
            emu = with_drift(emu, drift["compute"])
        simulated = emulated_problem(problem, emu)
        info = _host_info(simulated, plan, spec.n_workers, spec.n_shards, load_before)
        if on_step:
            on_step(f"{name}: des")
        sim = runner.evaluate(problem, plan, "des", trace=True, scheduler=sched_sim, emulation=emu)
        # the runtime's CPU per process (runtime_cpu): predicted from this first run's figures,
        # then the DES again with each process's CPU scaled to the prediction
        # (the diagnostics below start from that first run: they mean what they did before)
        base_emu, base_sim = emu, sim
        figs = runtime_cpu.figures(simulated, sim)
        cpu_model_scales = runtime_cpu.scales_for(simulated, figs)
        if cpu_model_scales:
            emu = emu.scaled(cpu_model_scales)
            sim = des_again(loaded, problem, name, emu, plan, trace=True)
        models = runtime_cpu.models_of(simulated)
        model_json = {simulated.cluster.device(d).type.name: m.to_json() for d, m in models.items()
                      if d in cpu_model_scales}
        # the DES as it was before hosts: every device computing on its own
        no_host = des_again(loaded, problem, name, emulation(problem, plan, opts), plan)
        # and with the host but messages free of CPU (copy_Bps 0), as before copies were charged
        no_copy = des_again(loaded, problem, name, without_copies(base_emu), plan)
        target = problem.job.target_loss
        pipe = problem.job.pipeline
        metrics = compare(measured_metrics(sim, target, pipe), measured_metrics(real, target))
        # diagnostic: the DES (its first run) given the real run's compute times (see
        # with_compute_scaled)
        base_metrics = compare(measured_metrics(base_sim, target, pipe), measured_metrics(real, target))
        factors = {}
        for d in plan.replicas:
            c = base_metrics.get(f"compute_s:{d.device}", {})
            c_sim, c_real = c.get("sim"), c.get("real")
            if c_sim and c_real:
                factors[d.device] = c_real / c_sim
        oracle = des_again(loaded, problem, name, with_compute_scaled(problem, base_emu, factors), plan)
        # and given the CPU each rank really used (see with_cpu_scaled)
        cpu = cpu_per_iteration(sim, real)
        cpu_factors = real_cpu_factors(cpu_per_iteration(base_sim, real))
        cpu_oracle = None
        if cpu_factors:
            cpu_oracle = des_again(loaded, problem, name, with_cpu_scaled(base_emu, cpu_factors),
                                   plan).summary()["iteration_time_s"]["mean"]
        diag = {"standalone_compute_s": {str(b): v for b, v in standalone.items()},
                "sim_with_real_compute": {"iteration_time_mean_s": oracle.summary()["iteration_time_s"]["mean"],
                                          "compute_factors": factors},
                "sim_without_host": {"iteration_time_mean_s": no_host.summary()["iteration_time_s"]["mean"]},
                "sim_without_copies": {"iteration_time_mean_s": no_copy.summary()["iteration_time_s"]["mean"]},
                "host": info["host"], "memory_probe": mem, "profiles": profiles,
                "shares": {r.device: r.batch for r in plan.replicas},
                "loadavg_1min": [load_before, load_after], "real_wall_s": wall,
                "real_repeats": {"iteration_time_mean_s": repeats_s},
                "drift": drift,
                "real_workers": real.summary()["workers"], "sim_workers": sim.summary()["workers"],
                "cpu_per_iteration": cpu,
                "sim_with_real_cpu": {"iteration_time_mean_s": cpu_oracle, "cpu_factors": cpu_factors},
                "runtime_cpu": {"models": model_json or None,
                                "figures": {dev: dataclasses.asdict(f) for dev, f in figs.items()},
                                "scales": {d: list(v) for d, v in cpu_model_scales.items()},
                                "sim_without_model": {"iteration_time_mean_s":
                                                      base_sim.summary()["iteration_time_s"]["mean"]}}}
        runs.append(SchedulerRun(name, metrics, diag))
        if out is not None:
            runner.write_run(out / name / "sim", sim, plan, loaded)
            entry.write(out / name / "real", real, plan, resolved)
    ranked = ranking_preserved(
        {r.scheduler: v for r in runs if (v := r.metrics["iteration_time_mean_s"]["sim"]) is not None},
        {r.scheduler: v for r in runs if (v := r.metrics["iteration_time_mean_s"]["real"]) is not None})
    # the --set overrides the config was read with: the record says what ran, and rescore
    # applies them again
    info["overrides"] = [[key, value] for key, _, value in registered(config)]
    result = Validation(source, cfg.name, runs, ranked, info)
    if out is not None:
        write_files(out, [result])
    return result


# ---------------------------------------------------------------------- files
def csv_rows(results: Sequence[Validation]) -> list[dict[str, Any]]:
    return [row for v in results for row in v.rows()]


def report_md(results: Sequence[Validation], title: str = "hetsim validate") -> str:
    """The markdown report: per config and scheduler, every metric's sim, real and error."""
    import pandas as pd

    lines = [f"# {title}", ""]
    for v in results:
        sets = "".join(f" --set {k}={json.dumps(x)}" for k, x in v.info.get("overrides", []))
        lines += [f"## {v.name} (`{v.config}`{sets})", ""]
        h = v.info
        lines.append(f"{h.get('workers')} workers, {h.get('shards')} PS shard(s), "
                     f"{h.get('worker_threads')} worker threads on {h.get('cores')} cores"
                     f"{' (oversubscribed)' if h.get('oversubscribed') else ''}; ranking preserved: "
                     f"{'-' if v.ranking_preserved is None else ('yes' if v.ranking_preserved else 'NO')}")
        lines.append("")
        for r in v.runs:
            hd = r.diagnostics.get("host")
            if hd:
                pl = hd.get("placement", {})
                lines += [f"DES host `{hd['name']}`: {hd['cores']} cores, {hd['background_threads']:.2f} "
                          "background threads (other jobs' load, probed just before the run; 1-min "
                          f"load average {hd['loadavg_1min']:.2f}); processes (threads, affinity): " + ", ".join(
                              f"{d} ({x['threads']}, {x['affinity'] if x['affinity'] is not None else 'any'})"
                              for d, x in pl.items()) + ".", ""]
            df = pd.DataFrame([{"metric": k, "sim": m["sim"], "real": m["real"], "error": pct(m["rel_error"])}
                               for k, m in r.metrics.items()])
            lines += [f"### {r.scheduler}", "",
                      f"Headline: {headline_text(headline(r.metrics, r.diagnostics))}.", "",
                      markdown_table(df), ""]
            sc = r.diagnostics.get("standalone_compute_s")
            if sc:
                lines.append("Compute of one share measured alone in this process (1 thread, median): " + ", ".join(
                    f"batch {b}: {1e3 * x['wall_s']:.3g} ms wall, {1e3 * x['cpu_s']:.3g} ms CPU"
                    for b, x in sc.items()) + f"; load average during the run "
                    f"{r.diagnostics['loadavg_1min'][0]:.2f} -> {r.diagnostics['loadavg_1min'][1]:.2f}.")
                nh = r.diagnostics.get("sim_without_host", {}).get("iteration_time_mean_s")
                if nh is not None:
                    real = r.metrics["iteration_time_mean_s"]["real"]
                    lines.append(f"The DES without the host (every device computing on its own): mean "
                                 f"iteration {nh:.4g} s ({pct(rel_error(nh, real))}).")
                lines.append("")
            mp = r.diagnostics.get("memory_probe")
            if mp:
                lines += [f"Memory probe (`memory_factor`): copies of {', '.join(f'{n:,}' for n in mp['elems'])} "
                          "fp32 values took " + ", ".join(f"{1e3 * a:.3g}" for a in mp["now_s"]) + " ms against "
                          "the profile's " + ", ".join(f"{1e3 * b:.3g}" for b in mp["profile_s"])
                          + f" ms: memory copies {mp['factor']:.3f} times the profile's, before the real runs "
                          "(a diagnostic; with a fresh profile the DES runs at the speed factor of the "
                          "headline: the runtime's model timed again around the run).", ""]
            rm = r.diagnostics.get("runtime_cpu") or {}
            if rm.get("models"):
                first = rm["sim_without_model"]["iteration_time_mean_s"]
                real = r.metrics["iteration_time_mean_s"]["real"]
                lines += ["The simulated side is the DES with each process's CPU predicted by the runtime CPU "
                          "model of the profile (`runtime_cpu`; compute x, copies x: " + ", ".join(
                              f"{d} {c:.2f}, {c * t:.2f}" for d, (c, t) in rm["scales"].items())
                          + f"); the DES without it: mean "
                          f"iteration {first:.4g} s ({pct(rel_error(first, real))}).", ""]
            cpu = r.diagnostics.get("cpu_per_iteration")
            if cpu:
                df = pd.DataFrame([{"process": k, **{c: round(x, 2) if isinstance(x, float) else x
                                                     for c, x in p.items()}}
                                   for k, p in cpu["processes"].items()])
                lines += [f"CPU per iteration (ms; `cpu_per_iteration`): in all {cpu['sim_total_ms']:.1f} simulated, "
                          f"{cpu['real_total_ms']:.1f} real ({pct(rel_error(cpu['sim_total_ms'], cpu['real_total_ms']))}"
                          f"); cores busy {cpu['sim_cores_busy']:.2f} simulated, "
                          f"{cpu['real_cores_busy']:.2f} real.", "", markdown_table(df), ""]
                rc = r.diagnostics.get("sim_with_real_cpu", {}).get("iteration_time_mean_s")
                real = r.metrics["iteration_time_mean_s"]["real"]
                if rc is not None:
                    lines += [f"The DES given each rank's real CPU (a diagnostic, `with_cpu_scaled`): mean "
                              f"iteration {rc:.4g} s ({pct(rel_error(rc, real))}).", ""]
                if (est := cpu_control_s(cpu)) is not None:
                    lines += [f"Control, no rerun: the real CPU per iteration over the cores the DES kept "
                              f"busy, {est:.4g} s ({pct(rel_error(est, real))}).", ""]
    return "\n".join(lines) + "\n"


def scatter(results: Sequence[Validation], path: Path, title: str = "sim vs real") -> None:
    """Simulated against real mean iteration time, one point per (config, scheduler), y = x line
    (:func:`experiments.plot_dirs.validation_figure`, also what ``hetsim plot`` draws)."""
    from experiments import plot_dirs

    plot_dirs.validation_chart(plot_dirs.validation_points([v.to_json() for v in results]), path, title)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    cols = ["config", "scheduler", "metric", "sim", "real", "rel_error"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in cols})
    atomic_write(path, buf.getvalue())


def write_files(out: Path, results: Sequence[Validation], title: str = "hetsim validate") -> None:
    """report.md, validation.csv, validation.json and sim_vs_real.png in ``out``."""
    atomic_write(out / "report.md", report_md(results, title))
    write_csv(out / "validation.csv", csv_rows(results))
    data = [v.to_json() for v in results]
    atomic_write(out / "validation.json", json.dumps(data[0] if len(data) == 1 else data, indent=2) + "\n")
    scatter(results, out / "sim_vs_real.png", title)
