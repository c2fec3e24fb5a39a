"""A PS shard's processor: one FIFO server for aggregation and update work."""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable

import simpy

from sim.des.kernel import call_later


class ShardServer:
    """Serves tasks one at a time in order of (ready time, key).

    Tasks that become ready at the same instant are collected by a zero-delay
    settle event and served in key order, so the order never depends on which
    SimPy event happened to fire first; the analytic evaluator sorts the same
    way. A key is an int, unique among the tasks in the queue at one time.

    A task's work is a plain timeout: the timer that started it (a settle, or the
    previous task's end) re-armed by the event loop (:func:`sim.des.kernel.run`)
    for the task's cost. ``run(cost_s, on_done)``, when given, executes it instead
    (a shard process on a host shares its cores:
    :meth:`sim.des.hosts.HostCPU.compute`); ``busy_s`` then adds the elapsed
    time of each task, which sharing stretches, rather than its cost.
    """

    __slots__ = ("env", "_tasks", "_busy", "_settle_pending", "busy_s", "_on_span", "_cb", "_label", "_t0", "_run",
                 "_next_cb", "_finish_cb")

    def __init__(self, env: simpy.Environment, on_span: Callable[[str, float, float], None] | None = None,
                 run: Callable[[float, Callable[[], None]], object] | None = None) -> None:
        self.env = env
        self._run = run
        # the tasks waiting, sorted by (ready time, key): they arrive nearly in that order
        # (ready times never decrease; only keys at one instant may come out of order), so a
        # task is appended (else inserted in place) and served from the front, where a heap
        # costs a pop of ~log2(n) levels a task (the 64-worker benchmark: ~0.7% of its time;
        # the front's pop(0) is O(n), a memmove: ~113 ns against heappop's ~249 at 1,021
        # waiting (1,024 workers), even at ~4,000, slower beyond;
        # the order is the heap's: (ready time, key) is unique among the tasks waiting)
        self._tasks: list[tuple[float, int, float, str, Callable[[], None] | None]] = []
        self._busy = False
        self._settle_pending = False
        self.busy_s = 0.0
        self._on_span = on_span
        # the task in service (one at a time): its callback, label and start time
        self._cb: Callable[[], None] | None = None
        self._label = ""
        self._t0 = 0.0
        # bound once: a task's start (a settle) and end are events of their own (a bound
        # method is made anew at every attribute access); both are _next, which tells them
        # apart by whether a task is in service
        self._next_cb = self._next
        self._finish_cb = self._finished

    def submit(self, key: int, cost_s: float, label: str, on_done: Callable[[], None] | None) -> None:
        task = (self.env.now, key, cost_s, label, on_done)
        queue = self._tasks
        if queue and task < queue[-1]:
            insort(queue, task)
        else:
            queue.append(task)
        if not self._busy and not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._next_cb)

    def _finished(self) -> None:
        """The task in service, run by ``run``, is done."""
        self._next(None)

    def _next(self, _ev: object) -> float | None:
        """The end of the task in service (while one is: a settle is scheduled only while
        none is, and none starts before the settle) or the settle; then the first task
        waiting starts, unless one is in service. One method for both, not a call from the
        end to the start (a task's end is one of a run's most frequent events). Returns the
        cost of a task started as a plain timeout: the event loop re-arms the timer that
        called for that long (its end)."""
        if self._busy:  # the task in service ended
            self._busy = False
            if self._run is not None:
                self.busy_s += self.env.now - self._t0
            if self._on_span is not None:
                self._on_span(self._label, self._t0, self.env.now)
            cb = self._cb
            if cb is not None:
                cb()
        self._settle_pending = False
        if not self._tasks:
            return None
        _, _, cost, self._label, self._cb = self._tasks.pop(0)
        self._busy = True
        self._t0 = self.env.now
        if self._run is not None:
            self._run(cost, self._finish_cb)
            return None
        self.busy_s += cost
        return cost
