"""Reference (per-flow) implementation of the fluid network, kept as a test oracle.

sim/des/network.py groups flows by (src, dst) pair for speed; this file is the
straightforward per-flow version of the same model, and
tests/test_network.py checks that both deliver every message at the same time.

Original description:

Every node has an uplink and a downlink (its NIC, one per direction). A flow
from A to B crosses A's uplink and B's downlink. With ``fair`` sharing, a
link's bandwidth is split equally among the flows on it and a flow runs at the
smaller of its two shares; capacity left unused by a flow that is throttled
elsewhere is not handed to the others (a conservative, local approximation of
max-min fairness that keeps each update O(flows on the two links touched)).
Without sharing every flow gets min(bw_up, bw_down), as on an ideal
non-blocking network. A message is delivered ``latency_s`` after its last
byte leaves the fluid model, so an uncontended message takes
latency_s + n / bw exactly as in the analytic evaluator.

Rates change only at flow arrivals and departures. Changes at one instant
are batched by a zero-delay settle event, and completions sit in a heap with
lazy invalidation, so the network costs O(log F) per event plus the flows
whose rate changed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import simpy


class _Flow:
    __slots__ = ("rem", "rate", "t", "src", "dst", "cb", "ver", "live")

    def __init__(self, nbytes: float, src: int, dst: int, cb: Callable[[], None], now: float) -> None:
        self.rem = nbytes
        self.rate = 0.0
        self.t = now
        self.src = src
        self.dst = dst
        self.cb = cb
        self.ver = 0
        self.live = True


class ReferenceFlowNetwork:
    """Point-to-point transfers over per-node up/down links.

    Args:
        env: the SimPy environment.
        link_bw_Bps: bandwidth of each link (index = link id).
        latency_s: added to every message after its last byte is sent.
        fair: share link bandwidth among concurrent flows (else: no contention).
    """

    def __init__(self, env: simpy.Environment, link_bw_Bps: Sequence[float], latency_s: float,
                 fair: bool = True) -> None:
        self.env = env
        self.bw = [float(b) for b in link_bw_Bps]
        self.latency_s = float(latency_s)
        self.fair = fair
        # dicts, not sets: iteration order must not depend on object ids (same seed, same bytes)
        self._flows: list[dict[_Flow, None]] = [{} for _ in self.bw]
        self._heap: list[tuple[float, int, int, _Flow]] = []
        self._dirty: set[int] = set()
        self._settle_pending = False
        self._wake_at = math.inf
        self._wake_token = 0
        self._seq = 0

    def transfer(self, src: int, dst: int, nbytes: float, on_delivered: Callable[[], None]) -> None:
        """Send ``nbytes`` from link ``src`` to link ``dst``; call ``on_delivered`` on arrival."""
        if nbytes <= 0:
            self._deliver(on_delivered)
            return
        if not self.fair:
            ev = self.env.timeout(nbytes / min(self.bw[src], self.bw[dst]))
            ev.callbacks.append(lambda _e: self._deliver(on_delivered))
            return
        self._start(src, dst, nbytes, on_delivered)

    def _start(self, src: int, dst: int, nbytes: float, on_delivered: Callable[[], None]) -> _Flow:
        """A flow of ``nbytes`` (> 0); returns its handle for :meth:`cancel`."""
        f = _Flow(nbytes, src, dst, on_delivered, self.env.now)
        self._flows[src][f] = None
        self._flows[dst][f] = None
        self._touch(src, dst)
        return f

    def cancel(self, f: _Flow) -> float:
        """Withdraw a flow that has not finished; returns the bytes it had not been sent
        (0 for a finished one)."""
        if not f.live:
            return 0.0
        left = f.rem - (f.rate * (self.env.now - f.t) if f.rate > 0.0 else 0.0)
        f.live = False
        del self._flows[f.src][f]
        del self._flows[f.dst][f]
        self._touch(f.src, f.dst)
        return max(left, 0.0)

    # -- internals ---------------------------------------------------------
    def _deliver(self, cb: Callable[[], None]) -> None:
        if self.latency_s > 0:
            self.env.timeout(self.latency_s).callbacks.append(lambda _e: cb())
        else:
            cb()

    def _touch(self, *links: int) -> None:
        self._dirty.update(links)
        if not self._settle_pending:
            self._settle_pending = True
            self.env.timeout(0).callbacks.append(self._settle)

    def _settle(self, _ev: object = None) -> None:
        """Recompute the rates of flows on links whose flow set changed."""
        self._settle_pending = False
        now = self.env.now
        flows = self._flows
        bw = self.bw
        affected: dict[_Flow, None] = {}
        for link in sorted(self._dirty):
            affected.update(flows[link])
        self._dirty.clear()
        share: dict[int, float] = {}
        heap, push = self._heap, heapq.heappush
        seq = self._seq
        for f in affected:
            a = share.get(f.src)
            if a is None:
                a = share[f.src] = bw[f.src] / len(flows[f.src])
            b = share.get(f.dst)
            if b is None:
                b = share[f.dst] = bw[f.dst] / len(flows[f.dst])
            r = a if a < b else b
            if r != f.rate:
                # bytes left only need settling when the rate changes
                if f.rate > 0.0:
                    f.rem -= f.rate * (now - f.t)
                f.t = now
                f.rate = r
                f.ver += 1
                seq += 1
                push(heap, (now + (f.rem if f.rem > 0.0 else 0.0) / r, seq, f.ver, f))
        self._seq = seq
        self._schedule_wake()

    def _schedule_wake(self) -> None:
        heap = self._heap
        while heap and (not heap[0][3].live or heap[0][2] != heap[0][3].ver):
            heapq.heappop(heap)
        if heap and heap[0][0] < self._wake_at:
            t = heap[0][0]
            self._wake_at = t
            self._wake_token += 1
            token = self._wake_token
            self.env.timeout(max(t - self.env.now, 0.0)).callbacks.append(lambda _e: self._wake(token))

    def _wake(self, token: int) -> None:
        now = self.env.now
        if token == self._wake_token:  # the earliest pending wake: none is pending after it
            self._wake_at = math.inf
        heap = self._heap
        # Flows due now (to float rounding of the wake time) complete together.
        horizon = now + 1e-12 * max(now, 1e-9)
        done: list[_Flow] = []
        while heap and heap[0][0] <= horizon:
            _, _, ver, f = heapq.heappop(heap)
            if f.live and ver == f.ver:
                done.append(f)
        for f in done:
            f.live = False
            del self._flows[f.src][f]
            del self._flows[f.dst][f]
            self._dirty.add(f.src)
            self._dirty.add(f.dst)
        for f in done:
            self._deliver(f.cb)
        if self._dirty:
            self._settle()
        else:
            self._schedule_wake()
