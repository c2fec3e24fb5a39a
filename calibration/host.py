"""What ``hetsim validate`` measures of this machine just before a run.

The cores this process may use and the background load of other jobs
(:func:`measure_host`, :func:`background_threads`), CPU ids as core indices of
that host (:func:`host_cores`), how much slower memory copies run now than when
a profile was measured (:func:`memory_factor`, :func:`copy_probe_s`), and what a
worker's compute costs here alone (:func:`standalone_compute_s`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.affinity import usable_cpus
from runtime.spec import RunSpec
from sim.cluster import Host
from sim.problem import Problem


def _spin(seconds: float) -> float:
    """Busy-loop for ``seconds`` of wall time; the fraction of a core this process got."""
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    return (time.process_time() - c0) / (time.perf_counter() - t0)


def background_threads(cores: int, probe_s: float = 1.0) -> float:
    """The load of other jobs as runnable threads competing fairly on every core, measured
    as what threads of ours get: ``cores`` busy processes run ``probe_s`` seconds, each gets
    a fraction r of a core, and fair sharing gives r = cores / (cores + B), so
    B = cores (1 / r - 1).

    Neither the load average nor a count of runnable threads: the first decays over a
    minute, so right after a run (the suite runs configs back to back) it still counts
    that run's ranks; the second counted 1.5-2.5 threads more than the compute of the
    runs showed here (other jobs' threads are not all equal competitors: priorities,
    cgroup weights), and this probe sees what the ranks will see.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ctx.Pool(cores) as pool:
        got = pool.map(_spin, [probe_s] * cores)
    r = min(1.0, max(1e-3, float(np.mean(got))))
    return cores * (1.0 / r - 1.0)


def measure_host(name: str = "local") -> Host:
    """This machine as a :class:`~sim.cluster.Host`: the cores this process may run on
    and the background load now (:func:`background_threads`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return Host(name, cores, round(background_threads(cores), 3))


def host_cores(cpus: list[int] | None) -> tuple[int, ...] | None:
    """CPU ids as the runtime pins them, as core indices of :func:`measure_host`'s host:
    their positions among the CPUs this process may use (under a cpuset of CPUs 2 and 3,
    CPU 3 is core 1). Ids outside those (``hetsim validate`` refuses them first) and
    every id where the CPUs are unknown are kept as they are."""
    if cpus is None:
        return None
    allowed = usable_cpus() or []
    if not set(cpus) <= set(allowed):
        return tuple(sorted(set(cpus)))
    return tuple(sorted(allowed.index(c) for c in set(cpus)))


def memory_factor(problem: Problem, probe: Callable[[int], float] | None = None,
                  min_elems: int = 1_000_000) -> dict[str, Any] | None:
    """How much slower memory copies run now than when the ranks' profile was measured:
    the median over the profile's ``raw.bandwidth`` copies of at least ``min_elems`` fp32
    values of (time now / time then), timed now by ``probe(elems)`` (default
    :func:`copy_probe_s`, as the profiler times them). Memory-bound work drifts with what
    shares the machine's memory bandwidth and caches (on this project's VM: copies 6-28%
    slower in one hour, GEMM unchanged). None where the profile has no such copies.
    `hetsim validate` reports it beside each run (``memory_probe``) and does not apply it."""
    cl = problem.cluster
    raws = [d.type.measurement.raw for d in cl.devices if d.type.measurement.raw]
    copies = sorted({(int(b["elems"]), float(b["t_s"])) for raw in raws[:1] for b in raw.get("bandwidth", [])
                     if b.get("op") == "copy" and int(b.get("elems", 0)) >= min_elems})
    if not copies:
        return None
    probe = probe or copy_probe_s
    now = [probe(n) for n, _ in copies]
    ratios = [t / then for t, (_, then) in zip(now, copies)]
    return {"factor": float(np.median(ratios)), "elems": [n for n, _ in copies],
            "now_s": now, "profile_s": [t for _, t in copies]}


def copy_probe_s(elems: int, repeats: int = 7) -> float:
    """Median thread time of ``Tensor.copy_`` of ``elems`` fp32 values (one thread, after a
    warm-up): the profiler's copy benchmark, on this process's CPUs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(elems), torch.empty(elems)
        for _ in range(2):
            b.copy_(a)
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            b.copy_(a)
            times.append(time.thread_time() - t0)
        return float(np.median(times))
    finally:
        torch.set_num_threads(threads)


def standalone_compute_s(spec: RunSpec, share: int, repeats: int = 7) -> dict[str, float]:
    """Median wall and thread-CPU seconds of the teacher labelling plus forward/backward on
    ``share`` samples in this process, one torch thread, nothing else of the run going on:
    what a worker's compute costs here without the other ranks sharing the cores."""
    import torch

    from runtime import task

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        module, _ = task.build(spec.model, spec.seed, spec.model_kwargs)
        module.train()
        teacher = task.Teacher(spec.model, spec.seed, spec.model_kwargs)
        wall, cpu = [], []
        for k in range(repeats + 2):
            gen, _ = task.iteration_generators(spec.seed, 0, k)
            a, c = time.perf_counter(), time.thread_time()
            x, y = teacher.batch(share, gen)
            module.zero_grad(set_to_none=False)
            task.loss_fn(task.call(module, x), y).backward()
            if k >= 2:  # the first passes allocate
                wall.append(time.perf_counter() - a)
                cpu.append(time.thread_time() - c)
        return {"wall_s": float(np.median(wall)), "cpu_s": float(np.median(cpu))}
    finally:
        torch.set_num_threads(old)
