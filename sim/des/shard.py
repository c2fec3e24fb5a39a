"""A PS shard's processor: one FIFO server for aggregation and update work."""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush

import simpy

from sim.des.timer import call_later


class ShardServer:
    """Serves tasks one at a time in order of (ready time, key).

    Tasks that become ready at the same instant are collected by a zero-delay
    settle event and served in key order, so the order never depends on which
    SimPy event happened to fire first; the analytic evaluator sorts the same
    way.

    ``run(cost_s, on_done)``, when given, executes a task's work instead of a
    plain timeout (a shard process on a host shares its cores:
    :meth:`sim.des.hosts.HostCPU.compute`); ``busy_s`` then adds the elapsed
    time of each task, which sharing stretches, rather than its cost.
    """

    __slots__ = ("env", "_heap", "_busy", "_settle_pending", "busy_s", "_on_span", "_cur", "_run")

    def __init__(self, env: simpy.Environment, on_span: Callable[[str, float, float], None] | None = None,
                 run: Callable[[float, Callable[[], None]], object] | None = None) -> None:
        self.env = env
        self._run = run
        self._heap: list[tuple[float, tuple[int, ...], float, str, Callable[[], None] | None]] = []
        self._busy = False
        self._settle_pending = False
        self.busy_s = 0.0
        self._on_span = on_span
        # the task in service (one at a time): its callback, label and start time
        self._cur: tuple[Callable[[], None] | None, str, float] = (None, "", 0.0)

    def submit(self, key: tuple[int, ...], cost_s: float, label: str,
               on_done: Callable[[], None] | None) -> None:
        heappush(self._heap, (self.env._now, key, cost_s, label, on_done))
        if not self._busy and not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._start)

    def _start(self, _ev: object = None) -> None:
        self._settle_pending = False
        if self._busy or not self._heap:
            return
        _, _, cost, label, cb = heappop(self._heap)
        self._busy = True
        env = self.env
        self._cur = (cb, label, env._now)
        if self._run is not None:
            self._run(cost, self._finish)
            return
        self.busy_s += cost
        call_later(env, cost, self._finish)

    def _finish(self, _ev: object = None) -> None:
        self._busy = False
        cb, label, t0 = self._cur
        if self._run is not None:
            self.busy_s += self.env.now - t0
        if self._on_span is not None:
            self._on_span(label, t0, self.env.now)
        if cb is not None:
            cb()
        self._start()
