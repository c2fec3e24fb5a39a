"""Links as a fluid network: concurrent flows share each link's bandwidth.

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

Rates change only at flow arrivals and departures. Flows between the same
two links always run at the same rate, so they are kept together in a pair
group with one service counter: a flow finishes when its group's counter
passes the value it had at the flow's start plus the flow's size. A change
then costs O(pairs on the two links touched) instead of O(flows). Changes at
one instant are batched by a zero-delay settle event, which re-rates (folds
the service counter and computes the next completion time of) every pair on a
link whose flow count changed and whose rate or earliest flow changed.

Each group's next completion, keyed (time, seq), sits in one heap with lazy
invalidation (a version number per pair). An entry need not be exact: a
re-rating that makes a pair finish later (an arrival slows it) keeps its live
entry, which is then a lower bound of the pair's key (earlier time, older
seq), and only records the new key on the pair; the entry is replaced by the
current key when it reaches the top of the heap. Only a re-rating that makes
a pair finish earlier pushes a new entry. The pairs are popped in the order
of their current keys all the same, so the results are those of an exact
heap, with about half the pushes. tests/fluid_oracle.py keeps the per-flow
version of the same model as a test oracle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from heapq import heappop, heappush

import simpy

from sim.des.timer import call_later

#: The rate of a pair whose flows changed since the last settle, which re-rates it.
#: Every share is > 0, so a dirty pair never looks current to :meth:`FluidShare._settle`
#: (one comparison instead of two per pair visited). Whoever marks a pair dirty has just
#: brought its service counter to the current time (``t = now``), so the rate it had is
#: not needed any more: the settle, at the same instant, would have added rate x 0.
DIRTY = -1.0


class _Pair:
    """Flows from one link to another: one rate, one service counter."""

    __slots__ = ("src", "dst", "rate", "served", "t", "flows", "ver", "due", "dseq", "ent")

    def __init__(self, src: int, dst: int, now: float) -> None:
        self.src = src
        self.dst = dst
        # DIRTY until the next settle rates it, and again whenever its flows change
        self.rate = DIRTY
        self.served = 0.0  # bytes each of its flows has received since the pair was created
        self.t = now
        self.flows: list[tuple[float, int, Callable[[], None]]] = []  # (served target, seq, cb)
        self.ver = 0  # an entry of the completion heap is live while it carries this
        # (due, dseq): the key of its next completion, from its latest re-rating; ``ent``:
        # the time of its live heap entry (inf: none), never later than ``due``
        self.due = math.inf
        self.dseq = 0
        self.ent = math.inf


class FluidShare:
    """Fluid sharing of resources among flows: the machinery, not the policy.

    A flow is an amount of work (bytes, core-seconds) crossing two resources
    ``src`` and ``dst``; it is served at ``min(share[src], share[dst])``, where
    a subclass's :meth:`_refresh` sets the share of each resource whose flow
    count changed (``self._n``). Flows between the same two resources are
    grouped in a :class:`_Pair` with one service counter (see the module
    docstring); completion callbacks run ``latency_s`` after the last unit of
    work is served. :class:`FlowNetwork` shares link bandwidth;
    :class:`sim.des.hosts.HostCPU` shares a host's cores.

    Args:
        env: the SimPy environment.
        n_resources: number of resources (ids 0 .. n - 1).
        latency_s: delay between a flow's last unit of work and its callback.
    """

    def __init__(self, env: simpy.Environment, n_resources: int, latency_s: float = 0.0) -> None:
        self.env = env
        self.latency_s = float(latency_s)
        self._n = [0] * n_resources  # flows on each resource
        # the share of each resource, refreshed by _refresh for the resources whose count
        # changed: a count changes only together with marking its resource dirty, so every
        # share _settle reads is current.
        self._share = [math.inf] * n_resources
        # dicts, not sets: iteration order must not depend on object ids (same seed, same bytes)
        # the pairs on each resource, each with its other resource
        self._pairs_on: list[dict[_Pair, int]] = [{} for _ in range(n_resources)]
        self._nres = n_resources
        self._pairs: dict[int, _Pair] = {}  # by src * n_resources + dst
        self._heap: list[tuple[float, int, int, _Pair]] = []
        self._dirty: set[int] = set()
        self._settle_pending = False
        self._wake_at = math.inf
        self._wake_token = 0
        self._seq = 0

    def _refresh(self, resources: list[int]) -> None:
        """Set ``self._share`` of ``resources`` (sorted) from their flow counts."""
        raise NotImplementedError

    def _start(self, src: int, dst: int, amount: float, on_done: Callable[[], None]) -> tuple[_Pair, int]:
        """Start a flow of ``amount`` (> 0) from ``src`` to ``dst``; returns its handle."""
        key = src * self._nres + dst
        p = self._pairs.get(key)
        if p is None:
            p = self._pairs[key] = _Pair(src, dst, self.env._now)
            self._pairs_on[src][p] = dst
            self._pairs_on[dst][p] = src
        elif p.rate > 0.0:
            now = self.env._now  # the property's value, without the call
            p.served += p.rate * (now - p.t)
            p.t = now
            p.rate = DIRTY  # its earliest target may have changed
        seq = self._seq = self._seq + 1
        heappush(p.flows, (p.served + amount, seq, on_done))
        n = self._n
        n[src] += 1
        n[dst] += 1
        dirty = self._dirty
        dirty.add(src)
        dirty.add(dst)
        if not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._settle)
        return p, seq

    def cancel(self, handle: tuple[_Pair, int]) -> float:
        """Withdraw a flow that has not finished (its callback is never called) and
        return the amount it had not been served; a finished one is left alone (0)."""
        p, seq = handle
        flows = p.flows
        i = next((k for k, f in enumerate(flows) if f[1] == seq), None)
        if i is None or self._pairs.get(p.src * self._nres + p.dst) is not p:
            return 0.0
        now = self.env._now  # the property's value, without the call
        if p.rate > 0.0:
            p.served += p.rate * (now - p.t)
        p.t = now
        p.rate = DIRTY
        left = max(flows[i][0] - p.served, 0.0)
        flows[i] = flows[-1]
        flows.pop()
        heapq.heapify(flows)
        self._n[p.src] -= 1
        self._n[p.dst] -= 1
        self._dirty.add(p.src)
        self._dirty.add(p.dst)
        if not flows:
            p.ver += 1  # its heap entry is stale now
            del self._pairs[p.src * self._nres + p.dst]
            del self._pairs_on[p.src][p]
            del self._pairs_on[p.dst][p]
        if not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._settle)
        return left

    # -- internals ---------------------------------------------------------
    def _settle(self, _ev: object = None) -> None:
        """Recompute the rates of pairs on links whose flow count changed."""
        self._settle_pending = False
        now = self.env._now  # the property's value, without the call
        share, pairs_on = self._share, self._pairs_on
        dirty = sorted(self._dirty)
        self._refresh(dirty)
        self._dirty.clear()
        heap, push = self._heap, heappush
        seq = self._seq
        # A pair on two dirty links is re-rated at its first visit; the second finds
        # its rate current and leaves it (the same order as visiting each pair once).
        # ``pairs_on[link]`` maps each pair to its other link, so the loop reads one
        # share per pair: this is the innermost loop of a network-bound run.
        for link in dirty:
            mine = share[link]
            for p, other in pairs_on[link].items():
                r = share[other]
                if mine <= r:
                    r = mine
                old = p.rate
                if r != old:  # changed, or DIRTY
                    served = p.served
                    if old > 0.0:
                        served += old * (now - p.t)
                        p.served = served
                    p.t = now
                    p.rate = r
                    seq += 1
                    left = p.flows[0][0] - served
                    due = now + (left if left > 0.0 else 0.0) / r
                    p.due = due
                    p.dseq = seq
                    # A live entry that is not later stays as a lower bound of the new
                    # key (its seq is older too): it is corrected when it reaches the top.
                    if due < p.ent:
                        ver = p.ver + 1
                        p.ver = ver
                        p.ent = due
                        push(heap, (due, seq, ver, p))
        self._seq = seq
        # Each pair has at most one live entry (the one with its ``ver``); the rest
        # are stale. Dropping them in bulk once they outnumber the pairs keeps the
        # heap small; (time, seq) keys are unique, so the pop order is unchanged.
        if len(heap) > 2 * len(self._pairs) + 64:
            heap[:] = [e for e in heap if e[2] == e[3].ver]
            heapq.heapify(heap)
        self._schedule_wake()

    def _top(self) -> tuple[float, int, int, _Pair] | None:
        """The heap's first entry once stale entries are dropped and a lower bound
        at the top is replaced by its pair's current key (None: the heap is empty)."""
        heap = self._heap
        while heap:
            e = heap[0]
            p = e[3]
            if e[2] != p.ver:
                heappop(heap)
            elif e[1] != p.dseq:
                p.ent = p.due
                heapq.heapreplace(heap, (p.due, p.dseq, e[2], p))
            else:
                return e
        return None

    def _schedule_wake(self) -> None:
        e = self._top()
        if e is not None and e[0] < self._wake_at:
            t = e[0]
            self._wake_at = t
            self._wake_token += 1
            token = self._wake_token
            call_later(self.env, max(t - self.env._now, 0.0), lambda _e: self._wake(token))

    def _wake(self, token: int) -> None:
        now = self.env._now  # the property's value, without the call
        if token == self._wake_token:  # the earliest pending wake: none is pending after it
            self._wake_at = math.inf
        heap = self._heap
        # Pairs due now (to float rounding of the wake time) complete together.
        horizon = now + 1e-12 * max(now, 1e-9)
        due: list[_Pair] = []
        while heap and heap[0][0] <= horizon:
            _, seq, ver, p = heappop(heap)
            if ver == p.ver:
                if seq == p.dseq:
                    due.append(p)
                else:  # a lower bound: back with its current key
                    p.ent = p.due
                    heappush(heap, (p.due, p.dseq, ver, p))
        delivered: list[Callable[[], None]] = []
        n, dirty, pop = self._n, self._dirty, heappop
        pairs, pairs_on, nres = self._pairs, self._pairs_on, self._nres
        for p in due:
            p.ver += 1  # its entry is consumed; settle pushes the next one
            p.ent = math.inf
            if p.rate > 0.0:  # not DIRTY (then t = now already)
                p.served += p.rate * (now - p.t)
            p.t = now
            p.rate = DIRTY
            # The earliest flow is due by construction (its entry is current); others
            # whose target is reached to rounding go with it. Never judge the earliest
            # by bytes: rounding in `served` could leave it a hair short forever.
            flows = p.flows
            first = flows[0][0]
            if p.served < first:
                p.served = first
            served = p.served
            tol = 1e-9 * (first if first > 1.0 else 1.0)
            src, dst = p.src, p.dst
            while flows and flows[0][0] - served <= tol:
                delivered.append(pop(flows)[2])
                n[src] -= 1
                n[dst] -= 1
            dirty.add(src)
            dirty.add(dst)
            if not flows:
                del pairs[src * nres + dst]
                del pairs_on[src][p]
                del pairs_on[dst][p]
        # One latency timer for every message this wake delivers: the per-message timers
        # would fire back to back at the same instant (consecutive event ids), and a
        # delivery callback schedules nothing urgent that could run between them.
        if delivered:
            if self.latency_s > 0:
                def deliver_all(_e: object) -> None:
                    for cb in delivered:
                        cb()

                call_later(self.env, self.latency_s, deliver_all)
            else:
                for cb in delivered:
                    cb()
        if dirty:
            self._settle()
        else:
            self._schedule_wake()


class FlowNetwork(FluidShare):
    """Point-to-point transfers over per-node up/down links.

    Args:
        env: the SimPy environment.
        link_bw_Bps: bandwidth of each link (index = link id).
        latency_s: added to every message after its last byte is sent.
        fair: share link bandwidth among concurrent flows (else: no contention).
    """

    def __init__(self, env: simpy.Environment, link_bw_Bps: Sequence[float], latency_s: float,
                 fair: bool = True) -> None:
        super().__init__(env, len(link_bw_Bps), latency_s)
        self.bw = [float(b) for b in link_bw_Bps]
        self.fair = fair
        self.bytes_sent = 0.0

    def transfer(self, src: int, dst: int, nbytes: float, on_delivered: Callable[[], None]) -> None:
        """Send ``nbytes`` from link ``src`` to link ``dst``; call ``on_delivered`` on arrival."""
        self.bytes_sent += nbytes
        if nbytes <= 0:
            self._deliver(on_delivered)
            return
        if not self.fair:
            call_later(self.env, nbytes / min(self.bw[src], self.bw[dst]), lambda _e: self._deliver(on_delivered))
            return
        self._start(src, dst, nbytes, on_delivered)

    def _refresh(self, resources: list[int]) -> None:
        """A link's bandwidth split equally among its flows (bw / n: one division per
        link instead of two per pair)."""
        bw, n, share = self.bw, self._n, self._share
        for link in resources:
            k = n[link]
            if k:
                share[link] = bw[link] / k

    def _deliver(self, cb: Callable[[], None]) -> None:
        if self.latency_s > 0:
            call_later(self.env, self.latency_s, lambda _e: cb())
        else:
            cb()
