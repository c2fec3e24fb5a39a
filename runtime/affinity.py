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

import bisect
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


#: the name (``/proc/self/task/*/comm``) of gloo's transport threads: one event loop per
#: process, which reads and writes every socket of the process group
GLOO_LOOP = "gloo_tcp_loop"


def threads_named(name: str) -> list[int]:
    """The ids of this process's threads called ``name`` now ([] without ``/proc``; the
    names as :func:`thread_cpu` reads them)."""
    return [tid for tid, (n, _) in (thread_cpu() or {}).items() if n == name]


def lower_priority(name: str, nice: int) -> int:
    """Give this process's threads called ``name`` the niceness ``nice`` (Linux: each
    thread's own ``setpriority``; raising it needs no privilege); returns how many
    threads got it (0 where the OS has no per-thread niceness or ``nice`` is 0).

    The runtime does this to gloo's event loop (:data:`GLOO_LOOP`) where
    ``runtime.gloo_loop_nice`` asks (default 0: not). That loop takes each socket's lock
    with a try-lock and, when another thread holds it, returns to ``epoll_wait``, whose
    level-triggered events are still there: on a core shared with the holder it spins
    through its time slice while the holder waits for the core. Niced, it yields the
    core to the holder, and to any compute on that core as well. On this project's
    2-core VM, at 19: c2 (pipelined pushes) 93 -> 43 ms an iteration, v7 (four ASP
    workers and the shard on two cores) 95 -> 102 ms, its workers' compute no longer
    slowed but their pushes waiting for the shard's starved loop
    (docs/notes/2026-12-07-gloo-loop-nice.md)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return 0
    done = 0
    for tid in threads_named(name):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            done += 1
        except OSError:
            pass  # the thread has exited
    return done


def in_force() -> dict[str, Any]:
    """The emulation this process really runs with: torch threads, the CPUs its threads
    may use (the union over every thread: gloo's included) and the niceness of gloo's
    event loop threads (``gloo_loop_nice``: the set of their values, sorted; [] without
    such a thread, None where the OS does not say)."""
    import torch

    nice: list[int] | None = None
    if hasattr(os, "getpriority") and thread_ids():
        values = set()
        for tid in threads_named(GLOO_LOOP):
            try:
                values.add(os.getpriority(os.PRIO_PROCESS, tid))
            except OSError:
                pass  # the thread has exited
        nice = sorted(values)
    if not hasattr(os, "sched_getaffinity"):
        return {"threads": torch.get_num_threads(), "affinity": None, "gloo_loop_nice": nice}
    cpus = set(os.sched_getaffinity(0))
    for tid in thread_ids():
        try:
            cpus |= os.sched_getaffinity(tid)
        except OSError:
            pass  # the thread has exited
    return {"threads": torch.get_num_threads(), "affinity": sorted(cpus), "gloo_loop_nice": nice}


def thread_cpu() -> dict[int, tuple[str, float]] | None:
    """Each live thread of this process: ``{thread id: (name, CPU seconds so far)}``.
    The CPU is the scheduler's run time in nanoseconds (``/proc/self/task/*/schedstat``),
    or user + system time in clock ticks (``stat``) where that is missing. The name is
    ``/proc/self/task/*/comm``: ``gloo_tcp_loop`` for gloo's transport threads; Python
    threads keep the process's name. None without ``/proc``."""
    tids = thread_ids()
    if not tids:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
            try:
                with open(f"/proc/self/task/{t}/schedstat") as f:
                    cpu = int(f.read().split()[0]) * 1e-9
            except (OSError, ValueError, IndexError):
                with open(f"/proc/self/task/{t}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except OSError:
            continue  # the thread has exited
        out[t] = (name, cpu)
    return out


class CpuMeter:
    """The CPU a process uses from its creation on: in all (``time.process_time``) and
    by thread name (:func:`thread_cpu`, each thread from its own start figure), against
    the wall time. A thread that exits before :meth:`read` drops out of its name's
    figure (not of the total), so the names need not add up to the total.

    :meth:`tick` (at its creation and at each of the process's iteration boundaries)
    records the wall clock and the CPU so far, so that the CPU of a window of the run
    (the iterations after the warm-up: :func:`window_cpu`) can be read afterwards; a
    tick costs two clock reads. Past ``MAX_TICKS`` every second record is dropped (a
    long run keeps a coarser but bounded record)."""

    MAX_TICKS = 4096

    def __init__(self) -> None:
        self.t0, self.c0, self.by0 = time.perf_counter(), time.process_time(), thread_cpu()
        self.ticks: list[tuple[float, float]] = []  # (time.time(), CPU seconds since creation)
        self.tick()  # its start: a window may begin before the first iteration boundary

    def tick(self) -> None:
        self.ticks.append((time.time(), time.process_time() - self.c0))
        if len(self.ticks) > self.MAX_TICKS:
            self.ticks = self.ticks[::2] if len(self.ticks) % 2 else [*self.ticks[:-1:2], self.ticks[-1]]

    def read(self) -> dict[str, Any]:
        """``{"wall_s", "cpu_s", "threads_cpu_s": {name: s} | None, "ticks": [[time, CPU
        so far], ...]}`` since creation; reading is a tick too (the last record)."""
        now = thread_cpu()
        threads: dict[str, float] | None = None
        if now is not None and self.by0 is not None:
            threads = {}
            for tid, (name, cpu) in now.items():
                start = self.by0[tid][1] if tid in self.by0 else 0.0
                threads[name] = threads.get(name, 0.0) + cpu - start
            threads = {k: round(v, 6) for k, v in sorted(threads.items())}
        self.tick()
        return {"wall_s": time.perf_counter() - self.t0, "cpu_s": time.process_time() - self.c0,
                "threads_cpu_s": threads, "ticks": [[round(t, 6), round(c, 6)] for t, c in self.ticks]}


def cpu_windows(cpu: dict[str, dict[str, Any] | None], warmup: int, t0: float, iter_end: list[float],
                resumed: bool = False) -> dict[str, dict[str, Any] | None]:
    """Each process's :meth:`CpuMeter.read` figures with its tick records replaced by
    ``window``: its CPU from the end of the warm-up (``t0 + iter_end[warmup - 1]``, wall
    clock) to the end of the last iteration, and ``iterations`` of them, where its ticks
    cover that window, so that CPU per iteration means what the iteration times mean
    (the start-up and the warm-up's one-off costs and the wait for the final reports
    left out). No window without a warm-up, without iterations after it, or in a
    ``resumed`` run (part of its iterations ran in processes that are gone)."""
    w, n = warmup, len(iter_end)
    out: dict[str, dict[str, Any] | None] = {}
    for proc, got in cpu.items():
        if got is None:
            out[proc] = None
            continue
        got = dict(got)
        ticks = got.pop("ticks", None)
        if ticks and 0 < w < n and not resumed:
            c = window_cpu(ticks, t0 + iter_end[w - 1], t0 + iter_end[-1])
            if c is not None:
                got["window"] = {"from_iteration": w, "iterations": n - w, "cpu_s": round(c, 6),
                                 "wall_s": round(iter_end[-1] - iter_end[w - 1], 6)}
        out[proc] = got
    return out


def window_cpu(ticks: list[list[float]], start: float, end: float, slack_s: float = 0.05) -> float | None:
    """CPU seconds between wall-clock times ``start`` and ``end`` from a process's
    :meth:`CpuMeter.tick` records ``[time, CPU so far]``, linear between ticks (a tick per
    iteration: the error is a fraction of one iteration's CPU at each end). ``end`` past
    the last tick by up to ``slack_s`` reads the last tick; None when the window is not
    covered (``start`` before the first tick, ``end`` well after the last, or fewer than
    two ticks)."""
    if len(ticks) < 2 or start < ticks[0][0] or end > ticks[-1][0] + slack_s or end < start:
        return None

    def at(x: float) -> float:
        i = bisect.bisect_right([t for t, _ in ticks], x)
        if i >= len(ticks):
            return ticks[-1][1]
        (t0, c0), (t1, c1) = ticks[i - 1], ticks[i]
        return c0 + (c1 - c0) * ((x - t0) / (t1 - t0) if t1 > t0 else 1.0)

    return at(end) - at(start)
