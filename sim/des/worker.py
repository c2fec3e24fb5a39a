"""The worker process of a data-parallel run: wait for parameters, compute, push gradients.

Each iteration a worker runs its layer groups' forwards in order, each once the
parameters of its chunks have arrived, then the backwards in reverse order,
pushing each group's gradient chunks as soon as its backward ends. Its compute
is a plain step on its :class:`~sim.des.kernel.Process` where nothing can
interrupt it, else a sleep a slowdown may stretch (:meth:`WorkerProcess._compute`)
or a flow on its host's cores (:meth:`WorkerProcess._host_compute`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import simpy

from sim.des.accounting import BLOCKED, COMPUTE, DONE, KEEP
from sim.des.kernel import sleep
from sim.des.ps import ParameterServer


class WorkerProcess(ParameterServer):
    """The workers' side of the run (a mixin of :class:`sim.des.engine.DataParallelSim`).

    A plain compute step (nothing can interrupt it: no host, no slowdown) is the worker
    process's own step (:class:`sim.des.kernel.Process`). Where every other yield of the
    loop is a chunk's wait (BSP, no online shares: no sub-generator), the step is
    ``direct``: the worker yields the step's delay and the generator's send alone
    resumes it, and its chunk waits go through the process's ``wait``; not the last
    backward step of an iteration, after which it may end (its end is ``_resume``'s to
    handle). A failure ends the worker.
    """

    __slots__ = ()

    def _worker(self, w: int) -> Any:
        """Worker w's process: iterations until the run has them all (BSP) or is finished."""
        step, wait = self.procs[w].step, self.procs[w].wait
        env, advance, ready = self.env, self.advance[w], self.ready[w]
        fwd, bwd, groups, fchunks, G = self.fwd[w], self.bwd[w], self.groups, self._forward_chunks(), self.G
        plain = self.proc[w] is None and w not in self.slowed  # nothing can interrupt its compute
        bsp, online, batch, noise = self.sync == "bsp", self.online, self.batch, self.noise[w]
        direct = plain and bsp and not online
        noted = online or self.trace is not None  # (see _noted)
        # pushes the network alone carries, deliveries made once (BSP, no trace, fixed rows)
        pushed = None if self.pushed_cb is None or self.host_messages else self.pushed_cb[w]
        transfer, down, push_b = self.net.transfer, self.chunk_down, self.push_b[w]  # (fixed rows there)
        adopt_at_pull = self.adopting and bsp  # BSP takes a new share with its first parameters
        k, it = 1.0, 0  # its compute factor this iteration (job.compute_noise), the iteration
        try:
            while (it < self.n_iter or not bsp) and not self.finished.triggered:
                if noise is not None:
                    k = next(noise)
                if self.adopting and not bsp:
                    yield from self._take_share(w)
                    fwd, bwd = self.fwd[w], self.bwd[w]
                if self.sync == "ssp":
                    yield from self._ssp_gate(w, it)
                spent = 0.0
                idle = batch[w] == 0  # the share it runs (set again where it takes a new one)
                for g in range(G):
                    for c in fchunks[g]:
                        if ready[c] is None:  # not arrived: wait for it
                            ev = ready[c] = env.event()
                            advance(env.now, 0, BLOCKED)
                            yield wait(ev)
                        ready[c] = None
                    if adopt_at_pull and g == 0:
                        self._adopt(w)
                        fwd, bwd = self.fwd[w], self.bwd[w]
                        idle = batch[w] == 0
                    if online:
                        yield from self._top_up(w, it, fchunks[g])
                    if idle:
                        continue
                    t0 = env.now
                    advance(t0, 0, COMPUTE)
                    if plain:  # (direct: its delay, a float, is the step)
                        yield fwd[g] * k if direct else step(fwd[g] * k)
                    else:
                        yield from self._compute_of(w, fwd[g] * k)
                    if noted:
                        spent = self._noted(w, "fwd", g, t0, spent)
                for g in range(G - 1, -1, -1):
                    if idle:
                        for c in groups[g]:
                            self._abstain(w, c)
                        continue
                    t0 = env.now
                    if plain:
                        yield bwd[g] * k if direct and g else step(bwd[g] * k)
                    else:
                        yield from self._compute_of(w, bwd[g] * k)
                    if noted:
                        spent = self._noted(w, "bwd", g, t0, spent)
                    chunks = groups[g]  # its gradient, pushed chunk by chunk
                    if not chunks:
                        continue
                    if pushed is None:
                        for c in chunks:
                            self._push(w, it, c)
                        continue
                    advance(env.now, len(chunks), KEEP)
                    for c in chunks:
                        transfer(w, down[c], push_b[c], pushed[c])
                self._iteration_done(w, it, spent, idle)
                it += 1
        except simpy.Interrupt:  # the worker failed (and ends here: nothing resumes it directly again)
            self._halt(w, DONE)
            return
        self._halt(w, BLOCKED)  # done computing; its last pushes and the others still run

    def _noted(self, w: int, what: str, g: int, t0: float, spent: float) -> float:
        """Worker w's step ``what`` (fwd or bwd) of layer group g, begun at ``t0``, ended:
        its span in the trace, and where online its compute added to ``spent`` (its
        window's compute, which only a rebalance reads); returns ``spent``."""
        now = self.env.now
        if self.online:
            spent += now - t0
        if self.trace is not None:
            name = what if self.G == 1 else f"{what} g{g}"
            q = self.quant[w][g] if what == "bwd" else 0.0
            if q > 0.0:  # the gradient's quantization, the step's last part: a span of its own
                split = now - (now - t0) * min(1.0, q / self.bwd[w][g])
                self.trace.span("workers", w, self.c.workers[w], name, t0, split)
                self.trace.span("workers", w, self.c.workers[w], "quant" if self.G == 1 else f"quant g{g}", split, now)
            else:
                self.trace.span("workers", w, self.c.workers[w], name, t0, now)
        return spent

    def _halt(self, w: int, state: int) -> None:
        """Worker w's loop is over: it is blocked until the end of the run, or failed (DONE)."""
        self.advance[w](self.env.now, 0, state)

    def _compute_of(self, w: int, work_s: float) -> Any:
        """The compute of ``work_s`` nominal seconds that worker w (not plain) yields from."""
        return self._host_compute(w, work_s) if self.proc[w] is not None else self._compute(w, work_s)

    def _forward_chunks(self) -> list[list[int]]:
        """The chunks each forward group waits for: its own; pulled whole (``pull_whole``),
        the first group every chunk and the others none."""
        if not self.pull_whole:
            return self.groups
        return [list(range(self.C))] + [[] for _ in range(self.G - 1)]

    def _take_share(self, w: int) -> Any:
        """ASP/SSP: worker w, at the top of an iteration, takes its pending share; with
        share 0 it idles until a rebalance gives it work (and does not hold back SSP)."""
        self._adopt(w)
        while self.batch[w] == 0:
            self.idle[w] = True
            self._ssp_release()
            self.advance[w](self.env.now, 0, BLOCKED)
            wake = self.wake[w] = self.env.event()
            yield wake
            self.idle[w] = False
            self._adopt(w)

    def _iteration_done(self, w: int, it: int, spent: float, idle: bool) -> None:
        """Worker w's backward of iteration ``it`` is done (its compute took ``spent``):
        blocked until its next iteration; its samples counted (BSP) or its progress
        told to SSP's waiters."""
        self.advance[w](self.env.now, 0, BLOCKED)
        if not idle:
            self.win_compute[w] += spent
            self.win_samples[w] += self.batch[w]
        if self.sync == "bsp":
            self.samples_in_iter[it] = self.samples_in_iter.get(it, 0) + self.batch[w]
            if self.conv is not None:
                by_bits = self.bits_in_iter.setdefault(it, {})
                by_bits[self.wbits[w]] = by_bits.get(self.wbits[w], 0) + self.batch[w]
        else:
            self.completed[w] = it + 1
            self._ssp_release()

    def _push(self, w: int, it: int, c: int) -> None:
        """Send worker w's gradient of chunk c (iteration ``it``) to its shard."""
        t0 = self.env.now
        self.advance[w](t0, 1, KEEP)
        # the shard's work follows the share of the iteration that produced the gradient
        delivered: Any
        if self.sync == "bsp":  # the aggregation alone
            delivered = partial(self._pushed_bsp, w, c, self.agg[w][c], t0)
        else:  # aggregated and applied at once
            delivered = partial(self._pushed, w, it, c, t0, self.agg[w][c] + self.apply_one[w][c], self.batch[w],
                                self.wbits[w])
        if self.host_messages:
            self.tx.send(w, self.N + self.chunk_shard[c], w, self.chunk_down[c], self.push_b[w][c], delivered)
        else:
            self.net.transfer(w, self.chunk_down[c], self.push_b[w][c], delivered)

    def _top_up(self, w: int, it: int, chunks: list[int]) -> Any:
        """Fetch the sparse rows a grown share needs beyond what the pulls carried."""
        evs = []
        for c in chunks:
            got = self.issued.pop((w, it, c), None)
            need = self.pull_b[w][c]
            if got is not None and need > got:
                ev = self.env.event()
                self._pull(w, it, c, need - got, ev)
                evs.append(ev)
        if evs:
            self.advance[w](self.env.now, 0, BLOCKED)
            yield self.env.all_of(evs)

    def _ssp_gate(self, w: int, it: int) -> Any:
        """SSP: wait until the slowest live worker is within the staleness bound of ``it``."""
        bound = self.problem.job.staleness
        while it - self._slowest() > bound:
            ev = self.env.event()
            self.ssp_waiters.append((it - bound, ev))
            self.advance[w](self.env.now, 0, BLOCKED)
            yield ev

    def _compute(self, w: int, work_s: float) -> Any:
        """``work_s`` seconds of nominal compute at the worker's current slowdown; a
        slowdown that changes midway (an interrupt) stretches only what is left."""
        self.computing[w] = True
        try:
            while True:
                t0, slow = self.env.now, self.slow[w]
                try:
                    yield sleep(self.env, work_s * slow)
                    return
                except simpy.Interrupt as e:
                    if e.cause != "slowdown":
                        raise
                    work_s -= (self.env.now - t0) / slow
        finally:
            self.computing[w] = False

    def _host_compute(self, w: int, work_s: float) -> Any:
        """``work_s`` seconds of nominal compute on worker w's host, at its fair share of
        the cores (stretched by the processes and background load it shares them with).

        A slowdown f > 1 (emulated like the runtime does it) then sleeps (f - 1) x the
        elapsed compute, not runnable, so the others get the cores meanwhile; f < 1 (a
        faster device) scales the work. The factor in force when the compute starts
        applies to all of it (a host compute is never interrupted by a slowdown).
        """
        env, cpu, slow = self.env, self.tx.cpu, self.slow[w]
        assert cpu is not None
        t0 = env.now
        done = env.event()
        self.flow[w] = cpu.compute(self.proc[w], work_s * min(slow, 1.0), done.succeed)  # type: ignore[arg-type]
        try:
            yield done
        except simpy.Interrupt:  # failed: its work stops competing for the cores
            if self.flow[w] is not None:
                cpu.cancel(self.flow[w])
            raise
        finally:
            self.flow[w] = None
        if slow > 1.0:
            yield sleep(env, (slow - 1.0) * (env.now - t0))
