"""The CPUs a process may use and its threads (Linux ``sched_*affinity`` and
``/proc/self/task``; elsewhere each function says what it does instead).

The runtime pins each rank with :func:`pin` before gloo starts its threads
(:func:`runtime.launch.run_rank`), records what is really in force with
:func:`in_force`, and checks the CPUs a config names against
:func:`usable_cpus` (:func:`runtime.spec.check_cpus`); ``hetsim validate`` and
the profiler's two-process benchmarks use the same helpers.
"""

from __future__ import annotations

import os
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
