"""The parameter-server side of a data-parallel run: parameters out, gradients in, updates.

A chunk's parameters go from its shard to each worker as a pull; a worker's
gradient of a chunk comes back as a push, which the shard aggregates (and under
ASP/SSP applies at once) on its :class:`~sim.des.shard.ShardServer`. Under BSP a
chunk's update is applied once every member's gradient (or abstention) of the
iteration has arrived, then the chunk is pulled by every live worker; under
ASP/SSP each worker pulls each chunk again once its own update of it is applied.
An iteration ends when every chunk is applied (BSP) or another global batch of
samples has been applied (ASP/SSP); applied samples are credited to the
convergence model.
"""

from __future__ import annotations

from functools import partial

import simpy

from sim.des.accounting import KEEP
from sim.des.online import Online


class ParameterServer(Online):
    """The shards' side of the run (a mixin of :class:`sim.des.engine.DataParallelSim`)."""

    __slots__ = ()

    # ---------------------------------------------------------------- pulls
    def _pull(self, w: int, it: int, c: int, nbytes: float | None = None,
              ev: simpy.Event | None = None) -> None:
        """Send chunk c's parameters for iteration ``it`` from its shard to worker w
        (``nbytes`` and ``ev``: a top-up of missing sparse rows).

        Where messages go through the hosts, the pull is in flight for worker w (its
        ``comm``, its span in the trace) from when it starts: a pull queued behind others on
        a serial link (``RuntimeEmulation.serial_messages``) is waiting, as in the runtime,
        where a worker's pull begins when its shard starts to answer it."""
        if ev is None:
            nbytes = self.next_pull[w][c]
            if self.online:
                self.issued[(w, it, c)] = nbytes
        assert nbytes is not None
        if self.host_messages:
            start = [0.0]

            def started() -> None:
                start[0] = self.env.now
                self.advance[w](start[0], 1, KEEP)

            self.tx.send(self.N + self.chunk_shard[c], w, self.chunk_up[c], self.N + w, nbytes,
                         lambda: self._pulled(w, c, start[0], ev), started)
            return
        t0 = self.env.now
        self.advance[w](t0, 1, KEEP)
        # A partial of a method, not a closure: one object made per message instead of a
        # function and a cell per captured variable; made once per (worker, chunk) where
        # the delivery needs nothing else (``pulled_cb``).
        if ev is None and self.pulled_cb is not None:
            delivered = self.pulled_cb[w][c]
        else:
            delivered = partial(self._pulled, w, c, t0, ev)
        self.net.transfer(self.chunk_up[c], self.N + w, nbytes, delivered)

    def _pull_all(self, it: int, c: int) -> None:
        """``_pull(w, it, c)`` to every live worker w in turn (BSP: chunk c was applied).

        Where the network alone carries the messages and the deliveries need only their
        worker and chunk (``pull_rows``: no trace, no online shares), each worker's time
        is advanced and the messages start in one call (the workers' times and the
        network's state are apart: the order between them is free)."""
        rows, alive = self.pull_rows, self.alive
        if rows is None:
            for w in self._answer_order():
                if alive[w]:
                    self._pull(w, it, c)
            return
        now = self.env.now
        for w, advance in enumerate(self.advance):
            if alive[w]:
                advance(now, 1, KEEP)
        mine = rows[c] if all(alive) else [r for r, up in zip(rows[c], alive) if up]
        self.net.transfer_many(self.chunk_up[c], mine)

    def _answer_order(self) -> list[int] | range:
        """The workers in the order their BSP pulls are answered: as asked (``asked_at``,
        ties by worker) under serial messages, else by worker."""
        if self.asked_at is None:
            return range(self.N)
        return sorted(range(self.N), key=self.asked_at.__getitem__)

    def _landed(self, w: int, label: str, t0: float) -> None:
        """A message of worker w's, sent at ``t0``, arrived: one transfer fewer in flight."""
        now = self.env.now
        self.advance[w](now, -1, KEEP)
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], label, t0, now)

    def _pulled(self, w: int, c: int, t0: float = 0.0, done: simpy.Event | None = None) -> None:
        """Chunk c's parameters, sent at ``t0`` (read only by a trace), reached worker w
        (``done``: a top-up's event). What ``_landed`` does, without its call (a pull is
        a third of a run's message ends)."""
        now = self.env.now
        self.advance[w](now, -1, KEEP)
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], self.pull_label[c], t0, now)
        if done is not None:  # a top-up
            done.succeed()
            return
        slot = self.ready[w]
        waiting = slot[c]
        if waiting is None:  # no one waits yet: no event needed
            slot[c] = True
        else:  # the worker asked first and waits on this event (never True: one pull per slot)
            waiting.succeed()  # type: ignore[union-attr]

    # ---------------------------------------------------------------- pushes
    def _pushed(self, w: int, it: int, c: int, t0: float, cost: float, batch: int, bits: int) -> None:
        """ASP/SSP: worker w's gradient of chunk c (iteration ``it``), sent at ``t0``, reached
        its shard, which aggregates and applies it in one task of ``cost`` seconds."""
        self._landed(w, self.push_label[c], t0)
        self.chunk_server[c].submit(c * self.key_base + w, cost, self.apply_label[c],
                                    lambda: self._async_applied(w, it, c, batch, bits))

    def _pushed_bsp(self, w: int, c: int, agg: float, t0: float = 0.0) -> None:
        """``_pushed`` under BSP, where the shard's work is the aggregation (``agg``) alone:
        it joins the chunk's barrier, whose last arrival submits the update. What
        ``_landed`` does, without its call (a push is a third of a run's message ends)."""
        now = self.env.now
        self.advance[w](now, -1, KEEP)
        if self.trace is not None:
            self.trace.async_span("network", w, self.c.workers[w], self.push_label[c], t0, now)
        if self.asked_at is not None:
            self.asked_at[w] = now
        miss = self.missing[c]
        miss.discard(w)
        self.chunk_server[c].submit(c * self.key_base + w, agg, self.agg_label[c], None)
        if not miss:
            self._submit_apply(c)

    def _abstain(self, w: int, c: int) -> None:
        """An idle worker (share 0) leaves the current BSP iteration's barrier of chunk c."""
        miss = self.missing[c]
        miss.discard(w)
        if not miss:
            self._submit_apply(c)

    # --------------------------------------------------------------- updates
    def _submit_apply(self, c: int) -> None:
        # The update is its own task, keyed after every worker's aggregation of this
        # chunk, so it never runs before one that arrived at the same instant.
        self.chunk_server[c].submit(c * self.key_base + self.N, self.apply_all[c], self.apply_label[c],
                                    lambda: self._bsp_applied(c))

    def _bsp_applied(self, c: int) -> None:
        it = self.chunk_iter[c]
        self.chunk_iter[c] = it + 1
        # Until its failure is detected, a dead worker is still waited for.
        self.missing[c] = self.members.copy()
        n = self.applied_in_iter.get(it, 0) + 1
        self.applied_in_iter[it] = n
        if n == self.C:
            samples = self.samples_in_iter.pop(it, 0)
            by_bits = self.bits_in_iter.pop(it, {})
            for bits in sorted(by_bits):
                self._credit(by_bits[bits], samples, 0.0, bits)
            self._end_iteration(samples)
        if it + 1 < self.n_iter:
            if self.pull_whole:  # every chunk once the iteration's last one is applied
                if n == self.C:
                    for w in self._answer_order():
                        if self.alive[w]:
                            for c_ in range(self.C):
                                self._pull(w, it + 1, c_)
                return
            self._pull_all(it + 1, c)

    def _async_applied(self, w: int, it: int, c: int, batch: int, bits: int) -> None:
        st = self.version[c] - self.pulled_version[w][c]
        self.staleness.append(st)
        self.version[c] += 1
        key = (w, it)
        n = self.worker_chunks_applied.get(key, 0) + 1
        if self.conv is not None:
            self.stale_sum[key] = self.stale_sum.get(key, 0) + st
        if n == self.C:
            self.worker_chunks_applied.pop(key, None)
            if self.conv is not None:
                self._credit(batch, batch, self.stale_sum.pop(key) / self.C, bits)
            self.samples_applied += batch
            B = self.problem.job.global_batch
            while self.samples_applied >= (len(self.iter_end) + 1) * B and not self.finished.triggered:
                self._end_iteration(B)
        else:
            self.worker_chunks_applied[key] = n
        if not self.finished.triggered and self.alive[w]:
            if not self.pull_whole:
                self.pulled_version[w][c] = self.version[c]
                self._pull(w, it + 1, c)
            elif n == self.C:  # all of w's chunks applied: it pulls them all
                for c_ in range(self.C):
                    self.pulled_version[w][c_] = self.version[c_]
                    self._pull(w, it + 1, c_)

    def _credit(self, samples: int, batch: int, staleness: float, bits: int) -> None:
        """``samples`` samples of an update of ``batch``, sent with ``bits``, were applied:
        count them as effective samples (loss, target)."""
        if self.conv is None:
            return
        self.eff_samples += self.conv.effective_samples(samples, batch, staleness, bits, self.tensor_elems)
        if (self.has_target and self.time_to_target is None
                and self.eff_samples >= self.eff_target * (1 - 1e-9)):
            self.time_to_target = self.env.now

    def _end_iteration(self, samples: int) -> None:
        self.iter_end.append(self.env.now)
        self.iter_samples.append(samples)
        if self.conv is not None:
            self.iter_loss.append(float(self.conv.loss(self.eff_samples)))
        if self.on_iteration is not None:
            self.on_iteration(len(self.iter_end))
        done = len(self.iter_end) >= self.n_iter or self.time_to_target is not None
        if done and not self.finished.triggered:
            self.finished.succeed()
        if self.qpolicy is not None and not self.finished.triggered:
            self._requantize()
        if self.online and not self.finished.triggered:
            self._rebalance()

    # ----------------------------------------------------------- SSP's bound
    def _slowest(self) -> int:
        live = [self.completed[v] for v in range(self.N) if self.alive[v] and not self.idle[v]]
        return min(live) if live else 0

    def _ssp_release(self) -> None:
        if not self.ssp_waiters:
            return
        slowest = self._slowest()
        keep = []
        for need, ev in self.ssp_waiters:
            if slowest >= need:
                ev.succeed()
            else:
                keep.append((need, ev))
        self.ssp_waiters = keep

