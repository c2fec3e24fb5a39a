"""Dynamics of a data-parallel run (``problem.dynamics``): slowdowns, failures, memory.

Each event is a process that waits until its time: a slowdown changes a worker's
compute factor (interrupting a compute in progress, which stretches what is
left); a failure stops the worker for good (under BSP it is still waited for
until ``job.failure_timeout_s`` later, when it leaves the barrier group); a
memory change sets the free fraction an online scheduler observes.
"""

from __future__ import annotations

from typing import Any

from sim.des.ps import ParameterServer


class Dynamics(ParameterServer):
    """The dynamics' processes (a mixin of :class:`sim.des.engine.DataParallelSim`)."""

    __slots__ = ()

    def _start_dynamics(self) -> None:
        """A process for each event of ``problem.dynamics`` on a worker of the plan."""
        for d in self.problem.dynamics:
            wi = self._worker_index(d.worker)
            if wi is None:
                continue
            if d.fail:
                self.env.process(self._failure(wi, d.at_s))
            elif d.slowdown is not None:
                self.env.process(self._slowdown(wi, d.at_s, d.slowdown))
            if d.free_memory_frac is not None:
                self.env.process(self._free_memory(wi, d.at_s, d.free_memory_frac))

    def _slowed(self) -> set[int]:
        """The workers a slowdown can interrupt."""
        return {wi for d in self.problem.dynamics if d.slowdown is not None
                and (wi := self._worker_index(d.worker)) is not None}

    def _worker_index(self, inventory_index: int) -> int | None:
        """The worker index of the cluster's device ``inventory_index`` (None: not in the plan)."""
        dev_id = self.problem.cluster.devices[inventory_index].id
        try:
            return self.c.workers.index(dev_id)
        except ValueError:
            return None

    def _slowdown(self, w: int, at_s: float, factor: float) -> Any:
        yield self.env.timeout(at_s)
        self.slow[w] = factor
        if self.computing[w] and self.alive[w]:
            self.procs[w].interrupt("slowdown")

    def _failure(self, w: int, at_s: float) -> Any:
        yield self.env.timeout(at_s)
        if not self.alive[w] or self.finished.triggered:
            return
        self.alive[w] = False
        if self.procs[w].is_alive:  # (one whose last compute is done has ended: nothing to stop)
            self.procs[w].interrupt("fail")
        failed_at = self.env.now
        rec = {"worker": self.c.workers[w], "failed_at_s": failed_at, "detected_at_s": None, "lost_s": None}
        self.failures.append(rec)
        if self.sync != "bsp":
            rec["detected_at_s"], rec["lost_s"] = failed_at, 0.0
            self.detected[w] = True
            self._ssp_release()
            return
        yield self.env.timeout(self.problem.job.failure_timeout_s)
        rec["detected_at_s"] = self.env.now
        rec["lost_s"] = self.env.now - failed_at
        self.members.discard(w)
        self.detected[w] = True
        for c in range(self.C):
            miss = self.missing[c]
            if w in miss:
                miss.discard(w)
                if not miss:
                    self._submit_apply(c)

    def _free_memory(self, w: int, at_s: float, frac: float) -> Any:
        yield self.env.timeout(at_s)
        self.free_frac[w] = frac
