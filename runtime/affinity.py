"""The CPUs a process may use and its threads (Linux ``sched_*affinity`` and
``/proc/self/task``; elsewhere each function says what it does instead).

The runtime pins each rank with :func:`pin` before gloo starts its threads
(:func:`runtime.launch.run_rank`), records what is really in force with
:func:`in_force`, and checks the CPUs a config names against
:func:`usable_cpus` (:func:`runtime.spec.check_cpus`), and measures the CPU
each rank's threads use with :class:`CpuMeter`; ``hetsim validate`` and the
profiler's two-process benchmarks use the same helpers.
"""

from __future__ import annotations

import os
import time
from typing import Any


def usable_cpus() -> list[int] | None:
    """The CPU ids this process may run on, sorted (None where the OS does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def thread_ids() -> list[int]:
    """The ids of this process's threads now ([] without ``/proc``)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def pin(cpus: list[int] | set[int]) -> None:
    """Pin this process to ``cpus``: every thread it has now (``import torch`` starts some)
    and, through the calling thread's affinity, every thread it starts later (a no-op
    where the OS has no affinity)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(0, set(cpus))
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, set(cpus))
        except OSError:
            pass  # the thread has exited


def in_force() -> dict[str, Any]:
    """The emulation this process really runs with: torch threads and the CPUs its
    threads may use (the union over every thread: gloo's included)."""
    import torch

    if not hasattr(os, "sched_getaffinity"):
        return {"threads": torch.get_num_threads(), "affinity": None}
    cpus = set(os.sched_getaffinity(0))
    for tid in thread_ids():
        try:
            cpus |= os.sched_getaffinity(tid)
        except OSError:
            pass  # the thread has exited
    return {"threads": torch.get_num_threads(), "affinity": sorted(cpus)}


def cpu_by_thread() -> dict[str, float] | None:
    """CPU seconds (user + system) this process's live threads have used, summed by
    thread name (``/proc/self/task/*/comm``: ``gloo_tcp_loop`` for gloo's transport
    threads; Python threads keep the process's name). None without ``/proc``."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    out: dict[str, float] = {}
    tids = thread_ids()
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread has exited
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out if tids else None


class CpuMeter:
    """The CPU a process uses from its creation on: in all (``time.process_time``) and
    by thread name (:func:`cpu_by_thread`; a thread that exits meanwhile drops out of
    its name's figure, not of the total), against the wall time."""

    def __init__(self) -> None:
        self.t0, self.c0, self.by0 = time.perf_counter(), time.process_time(), cpu_by_thread()

    def read(self) -> dict[str, Any]:
        """``{"wall_s", "cpu_s", "threads_cpu_s": {name: s} | None}`` since creation."""
        by = cpu_by_thread()
        threads = None
        if by is not None and self.by0 is not None:
            threads = {k: round(v - self.by0.get(k, 0.0), 4) for k, v in sorted(by.items())}
        return {"wall_s": time.perf_counter() - self.t0, "cpu_s": time.process_time() - self.c0,
                "threads_cpu_s": threads}
