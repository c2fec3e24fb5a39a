"""Links as a fluid network: concurrent flows share each link's bandwidth.

Every node has an uplink and a downlink (its NIC, one per direction). A flow
from A to B crosses A's uplink and B's downlink. With ``fair`` sharing, a
link's bandwidth is split equally among the flows on it and a flow runs at the
smaller of its two shares; capacity left unused by a flow that is throttled
elsewhere is not handed to the others (a conservative, local approximation of
max-min fairness). Without sharing every flow gets min(bw_up, bw_down), as on
an ideal non-blocking network. A message is delivered ``latency_s`` after its
last byte leaves the fluid model, so an uncontended message takes
latency_s + n / bw exactly as in the analytic evaluator.

Rates change only at flow arrivals and departures. Changes at one instant are
batched by a zero-delay settle event, which applies the new shares of the
resources whose flow count changed (by default a resource's capacity split
equally among its flows; :class:`sim.des.hosts.HostCPU` has its own policy)
and reschedules. The machinery (:class:`FluidShare`):

* Pairs. Flows between the same two resources always run at the same rate,
  so they are kept together in a pair.
* Virtual clocks (the processor-sharing trick). Each resource L has a clock
  V[L] that advances at its share, ``share[L]`` per second; it is folded to
  the current time whenever the share changes, and restarts at 0 when a flow
  comes to L after none of its pairs had one (small values, small rounding).
  Each pair is *bound* to the one of its two resources whose share is the
  smaller (the pair's rate) and runs on that resource's clock: a flow's target
  is the value of the clock at which it is done (the clock when it started
  plus its size), so a change of share[L] re-rates every pair bound to L at
  once, without visiting any of them. Each resource keeps a heap of its
  bound pairs by their earliest target, and its next completion,
  ``t[L] + (min target - V[L]) / share[L]``, sits in one global heap (lazy
  invalidation by a version per resource) from which the wake-ups are taken.
* Thresholds. A binding stays valid while share[bound] <= share[other]. Each
  bound pair holds a threshold th between the two shares (their geometric
  mean), registered with its bound resource (a min-heap: that share may rise
  up to th) and with its other resource (a max-heap: that share may fall down
  to th). When a share changes only the entries it crosses are visited, in
  heap order: a pair whose binding still holds gets a new threshold, one whose
  other side is now strictly smaller is rebound there (its targets carried
  from the old clock to the new one). A change that crosses no threshold costs
  O(1) whatever the number of pairs the resource limits. Ties keep the
  binding they have (a new pair binds to src on a tie): the rate is the same
  either way. A pair whose flows are all done stays bound, thresholds and
  all, until a threshold check finds it empty and drops it, so a pair that
  comes back soon (the next chunk between the same two nodes) costs no new
  binding.
* Completions. A wake takes every resource whose next completion is due (to
  float rounding of the wake time) and, on each, every pair whose earliest
  target the clock reaches by then; the first one is due by construction
  when its resource is unchanged since its entry was made (never judged by
  the clock, which rounding could leave a hair short forever). Each pair
  delivers its earliest flow and every other one whose target the clock
  reaches by the wake's horizon (to a few ulps). Messages finishing at one
  wake are delivered together, resource by resource in the order of their
  entries and each one's pairs in the order of their targets, after one
  latency timer. Equal shares leave a threshold no room (it equals both
  shares), so a change of a tied share visits every pair tied on it: O(1)
  per change holds away from ties, O(tied pairs) at them.

Everything is keyed by seq numbers and iterated in list or dict order, never
by object ids, so a run is reproducible to the byte. tests/fluid_oracle.py
keeps the per-flow version of the same model as a test oracle; results differ
from it (and from the per-pair re-rating this replaced) by float rounding only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from heapq import heappop, heappush, heapreplace

import simpy

from sim.des.kernel import Timer, call_later

_INF = math.inf


def _drop_stale(due: list[tuple[float, int, int, _Pair]]) -> None:
    """Drop the stale entries of a completion heap (once they outnumber its live ones, so
    the cost is amortised). A pair's entry goes stale whenever a new flow becomes its
    earliest (a small chunk behind a big one): left alone, a shard downlink's heap held ~450
    entries for ~56 live ones in the 64-worker benchmark. Entries have unique keys, so the
    arrangement left does not change the order in which they come off."""
    due[:] = [e for e in due if e[2] == e[3].ver]
    heapq.heapify(due)


class _Pair:
    """Flows from one resource to another: one rate, the clock of the resource it is bound to."""

    __slots__ = ("src", "dst", "flows", "b", "o", "ver", "tver")

    def __init__(self, src: int, dst: int) -> None:
        self.src = src
        self.dst = dst
        # (target, seq, cb): the value of its resource's virtual clock at which the flow is
        # done (before its first binding: its service from 0, the clock then being 0)
        self.flows: list[tuple[float, int, Callable[[], None]]] = []
        # the resource it is bound to (its rate is that one's share) and the other one;
        # -1 until the settle after its creation binds it
        self.b = -1
        self.o = -1
        self.ver = 0  # an entry of its resource's completion heap is live while it carries this
        self.tver = 0  # its two threshold entries are live while they carry this


class FluidShare:
    """Fluid sharing of resources among flows: the machinery, not the policy.

    A flow is an amount of work (bytes, core-seconds) crossing two resources
    ``src`` and ``dst``; it is served at ``min(share[src], share[dst])``, where
    a subclass's :meth:`_refresh` sets the share of each resource whose flow
    count changed (``self._n``) and of any other whose share follows from them.
    Flows between the same two resources are grouped in a :class:`_Pair`, and
    each pair is served by the virtual clock of the resource that limits it
    (see the module docstring); completion callbacks run ``latency_s`` after the
    last unit of work is served. :class:`FlowNetwork` shares link bandwidth;
    :class:`sim.des.hosts.HostCPU` shares a host's cores.

    Args:
        env: the SimPy environment.
        n_resources: number of resources (ids 0 .. n - 1).
        latency_s: delay between a flow's last unit of work and its callback.
        capacity: each resource's capacity, split equally among its flows (a
            resource without flows keeps its last share); None: the subclass's
            :meth:`_refresh` sets the shares.
    """

    # slots: the machinery's state is read at every flow's start and end (a subclass's own
    # attributes live in an instance dict: it declares no slots)
    __slots__ = ("env", "latency_s", "_cap", "_nres", "_n", "_share", "_vr", "_V", "_t", "_na", "_nb", "_nu",
                 "_due", "_up", "_lo", "_heap", "_rver", "_heap_cap", "_rdue", "_pairs", "_pending", "_resched",
                 "_dirty", "_settle_pending", "_wake_at", "_wake_timer", "_wake_cb", "_seq")

    def __init__(self, env: simpy.Environment, n_resources: int, latency_s: float = 0.0,
                 capacity: Sequence[float] | None = None) -> None:
        self.env = env
        self.latency_s = float(latency_s)
        R = n_resources
        # the default policy: a resource's capacity split equally among its flows; None:
        # the subclass's _refresh sets the shares
        self._cap = None if capacity is None else [float(c) for c in capacity]
        self._nres = R
        self._n = [0] * R  # flows on each resource
        # the share of each resource as _refresh sets it (without a capacity); _vr: the share
        # its virtual clock runs at and the bindings follow, brought up to date by each settle
        self._share = [_INF] * R
        self._vr = [_INF] * R
        # virtual clock: V[L] at time t[L], read only while a pair bound to L has flows; it
        # restarts at 0 when one comes after none had (small values, small rounding)
        self._V = [0.0] * R
        self._t = [0.0] * R
        self._na = [0] * R  # pairs with flows bound to each resource
        self._nb = [0] * R  # pairs bound to each resource, with flows or not
        self._nu = [0] * R  # pairs with this resource as their other (unbound) side
        # per resource: its bound pairs with flows by their earliest target, (target, flow
        # seq, ver, pair); the thresholds of its bound pairs, (th, seq, tver, pair); and those
        # of the pairs it does not bind, negated for a max-heap, (-th, seq, tver, pair)
        self._due: list[list[tuple[float, int, int, _Pair]]] = [[] for _ in range(R)]
        self._up: list[list[tuple[float, int, int, _Pair]]] = [[] for _ in range(R)]
        self._lo: list[list[tuple[float, int, int, _Pair]]] = [[] for _ in range(R)]
        # each resource's next completion: (time, seq, resource, rver) in one heap, live while
        # rver is the resource's; _rdue: the time of its live entry (inf: none)
        self._heap: list[tuple[float, int, int, int]] = []
        self._rver = [0] * R
        self._heap_cap = 64  # its length that triggers the next drop of stale entries
        self._rdue = [_INF] * R
        # by src * n_resources + dst; a pair whose flows are done stays (bound, its
        # thresholds kept) until a threshold check finds it empty, so a pair that comes
        # back soon costs no new binding
        self._pairs: dict[int, _Pair] = {}
        self._pending: list[_Pair] = []  # pairs created since the last settle, not bound yet
        # resources whose next completion may have changed (a dict: ordered, deterministic)
        self._resched: dict[int, None] = {}
        self._dirty: set[int] = set()
        self._settle_pending = False
        self._wake_at = _INF
        # the wake timer scheduled last (the pending one at _wake_at, until it fires): a wake
        # compares its own timer with it; _wake_cb bound once for every wake
        self._wake_timer: Timer | None = None
        self._wake_cb = self._wake
        self._seq = 0

    def _refresh(self, resources: list[int]) -> Iterable[int]:
        """Set ``self._share`` of ``resources`` (sorted) from their flow counts, and of
        any resource whose share depends on theirs; returns every resource it may have
        changed (in a deterministic order). Used when no ``capacity`` was given."""
        raise NotImplementedError

    def _start(self, src: int, dst: int, amount: float,
               on_done: Callable[[], None]) -> tuple[_Pair, int] | None:
        """Start a flow of ``amount`` from ``src`` to ``dst``; returns its handle. An amount
        <= 0 is no flow: ``on_done`` after the latency alone (no handle)."""
        p = self._add(src, dst, amount, on_done)
        return None if p is None else (p, self._seq)  # (the flow's seq: the last one taken)

    def _add(self, src: int, dst: int, amount: float, on_done: Callable[[], None]) -> _Pair | None:
        """:meth:`_start` returning the flow's pair rather than its handle: no tuple made
        where none is needed (a message: ~25 ns, about 1% of the 64-worker benchmark)."""
        if amount <= 0.0:  # (0.0: CPython 3.11 specialises a float-float comparison, not float-int)
            self._deliver(on_done)
            return None
        key = src * self._nres + dst
        p = self._pairs.get(key)
        seq = self._seq = self._seq + 1
        if p is None:
            p = self._pairs[key] = _Pair(src, dst)
            self._pending.append(p)
            p.flows.append((amount, seq, on_done))
        elif p.b < 0:  # not bound yet: its service is 0
            heappush(p.flows, (amount, seq, on_done))
        else:  # bound: its target on b's clock (this branch last: a short jump from the test
            # above, which CPython 3.11 specialises only where the jump needs no EXTENDED_ARG)
            b = p.b
            flows = p.flows
            if flows:
                x = self._V[b] + self._vr[b] * (self.env.now - self._t[b]) + amount
            else:  # back from idle (see _idle)
                na = self._na
                if na[b]:
                    v = self._V[b] + self._vr[b] * (self.env.now - self._t[b])
                else:
                    v = self._V[b] = 0.0
                    self._t[b] = self.env.now
                x = v + amount
                na[b] += 1
            heappush(flows, (x, seq, on_done))
            if flows[0][1] == seq:  # its earliest flow now
                ver = p.ver = p.ver + 1
                due = self._due[b]
                heappush(due, (x, seq, ver, p))
                self._resched[b] = None
                if len(due) > 2 * self._na[b] + 16:
                    _drop_stale(due)
        n = self._n
        n[src] += 1
        n[dst] += 1
        dirty = self._dirty
        dirty.add(src)
        dirty.add(dst)
        if not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._settle)
        return p

    def _start_many(self, src: int, flows: Iterable[tuple[int, float, Callable[[], None]]]) -> None:
        """``_start(src, dst, amount, on_done)`` for each ``(dst, amount, on_done)`` of
        ``flows`` in turn: the same seq numbers, events and state.

        One source often starts many flows at one instant (a shard sends a chunk to every
        worker). A flow onto a pair that is bound already, the common case, takes
        ``_add``'s bound branch inlined here, the state read into locals once per batch
        (measured: ~170 ns a flow less); any other goes through ``_add``."""
        pairs, n, dirty, V, vr, t, na = self._pairs, self._n, self._dirty, self._V, self._vr, self._t, self._na
        dues, resched = self._due, self._resched
        now = self.env.now
        base = src * self._nres
        # flows that took the inlined branch: src's count raised and src marked dirty once,
        # after the loop (counts are ints, and nothing in the loop reads src's); the settle
        # scheduled by the first of them, as _add would (once scheduled, it stays pending)
        bound = 0
        for dst, amount, on_done in flows:
            p = pairs.get(base + dst)
            if p is None or p.b < 0 or amount <= 0.0:
                self._add(src, dst, amount, on_done)
                continue
            if not bound and not self._settle_pending:
                self._settle_pending = True
                call_later(self.env, 0, self._settle)
            bound += 1
            seq = self._seq = self._seq + 1
            b = p.b
            fl = p.flows
            if fl:
                x = V[b] + vr[b] * (now - t[b]) + amount
            else:  # back from idle (see _idle)
                if na[b]:
                    x = V[b] + vr[b] * (now - t[b]) + amount
                else:
                    V[b] = 0.0
                    t[b] = now
                    x = 0.0 + amount
                na[b] += 1
            heappush(fl, (x, seq, on_done))
            if fl[0][1] == seq:  # its earliest flow now
                ver = p.ver = p.ver + 1
                due = dues[b]
                heappush(due, (x, seq, ver, p))
                resched[b] = None
                if len(due) > 2 * na[b] + 16:
                    _drop_stale(due)
            n[dst] += 1
            dirty.add(dst)
        if bound:  # (a set: when it is marked before the settle does not matter)
            n[src] += bound
            dirty.add(src)

    def _deliver(self, cb: Callable[[], None]) -> None:
        """``cb`` after the latency (at once without one)."""
        if self.latency_s > 0.0:
            call_later(self.env, self.latency_s, lambda _e: cb())
        else:
            cb()

    def cancel(self, handle: tuple[_Pair, int]) -> float:
        """Withdraw a flow that has not finished (its callback is never called) and
        return the amount it had not been served; a finished one is left alone (0)."""
        p, seq = handle
        flows = p.flows
        i = next((k for k, f in enumerate(flows) if f[1] == seq), None)
        if i is None:
            return 0.0
        now = self.env.now
        b = p.b
        v = self._V[b] + self._vr[b] * (now - self._t[b]) if b >= 0 else 0.0
        left = max(flows[i][0] - v, 0.0)
        flows[i] = flows[-1]
        flows.pop()
        heapq.heapify(flows)
        self._n[p.src] -= 1
        self._n[p.dst] -= 1
        self._dirty.add(p.src)
        self._dirty.add(p.dst)
        if b < 0:
            if not flows:  # never bound: gone (the settle skips it)
                del self._pairs[p.src * self._nres + p.dst]
        elif not flows:
            self._idle(p)
        elif i == 0:  # its earliest flow went
            ver = p.ver = p.ver + 1
            heappush(self._due[b], (flows[0][0], flows[0][1], ver, p))
            self._resched[b] = None
        if not self._settle_pending:
            self._settle_pending = True
            call_later(self.env, 0, self._settle)
        return left

    # -- internals ---------------------------------------------------------
    def _idle(self, p: _Pair) -> None:
        """``p``'s last flow went: off its resource's completion heap (it stays bound)."""
        b = p.b
        p.ver += 1
        na = self._na
        na[b] -= 1
        self._resched[b] = None
        if not na[b]:
            self._due[b].clear()

    def _unbind(self, p: _Pair) -> None:
        """Take ``p`` off its resource (its entries go stale)."""
        if p.flows:
            self._idle(p)
        b, o = p.b, p.o
        p.tver += 1
        p.b = p.o = -1
        nb, nu = self._nb, self._nu
        nb[b] -= 1
        nu[o] -= 1
        if not nb[b]:
            self._up[b].clear()
        if not nu[o]:
            self._lo[o].clear()

    def _bind(self, p: _Pair, L: int, oth: int, off: float, now: float) -> None:
        """Bind ``p`` (with flows) to resource ``L``, its other side ``oth``; requires
        ``_vr[L] <= _vr[oth]``. Its targets, now on a clock that reads ``off`` (0 for a
        new pair: its flows' sizes), move to ``L``'s."""
        V, t, na, nb, nu, vr = self._V, self._t, self._na, self._nb, self._nu, self._vr
        if na[L]:
            v = V[L] = V[L] + vr[L] * (now - t[L])
        else:
            v = V[L] = 0.0
        t[L] = now
        na[L] += 1
        nb[L] += 1
        nu[oth] += 1
        p.b = L
        p.o = oth
        flows = p.flows
        d = v - off
        if d != 0.0:
            # the shift keeps their order, but rounding may tie two targets: heapify
            flows[:] = [(x + d, s, cb) for x, s, cb in flows]
            if len(flows) > 1:
                heapq.heapify(flows)
        ver = p.ver = p.ver + 1
        due = self._due[L]
        heappush(due, (flows[0][0], flows[0][1], ver, p))
        self._resched[L] = None
        if len(due) > 2 * na[L] + 16:
            _drop_stale(due)
        self._threshold(p, L, oth)

    def _threshold(self, p: _Pair, L: int, oth: int) -> None:
        """Give ``p`` (bound to ``L``, other side ``oth``) a threshold between their shares:
        their geometric mean, as much room for either share to move (inf if ``oth``'s is)."""
        a, c = self._vr[L], self._vr[oth]
        th = math.sqrt(a * c)
        if th < a:
            th = a
        elif th > c:
            th = c
        seq = self._seq = self._seq + 1
        tv = p.tver = p.tver + 1
        up, lo = self._up[L], self._lo[oth]
        heappush(up, (th, seq, tv, p))
        heappush(lo, (-th, seq, tv, p))
        if len(up) > 2 * self._nb[L] + 16:
            up[:] = [e for e in up if e[2] == e[3].tver]
            heapq.heapify(up)
        if len(lo) > 2 * self._nu[oth] + 16:
            lo[:] = [e for e in lo if e[2] == e[3].tver]
            heapq.heapify(lo)

    def _recheck(self, p: _Pair, now: float) -> None:
        """A share crossed ``p``'s threshold: a pair without flows is dropped; one whose
        binding holds gets a new threshold; else it is rebound to its other side, its
        targets carried from the old clock to the new one."""
        L, oth = p.b, p.o
        if not p.flows:
            self._unbind(p)
            del self._pairs[p.src * self._nres + p.dst]
            return
        vr = self._vr
        if vr[L] <= vr[oth]:
            self._threshold(p, L, oth)
            return
        v = self._V[L] + vr[L] * (now - self._t[L])
        self._unbind(p)
        self._bind(p, oth, L, v, now)

    def _settle(self, _ev: object = None) -> None:
        """Apply the shares of resources whose flow count changed, fix the bindings
        their changes invalidate, bind new pairs, and reschedule."""
        self._settle_pending = False
        now = self.env.now
        dirty = sorted(self._dirty)
        self._dirty.clear()
        share, vr, V, t, na = self._share, self._vr, self._V, self._t, self._na
        resched = self._resched
        cap, n, ups, los = self._cap, self._n, self._up, self._lo
        for L in (dirty if cap is not None else self._refresh(dirty)):
            if cap is None:
                new = share[L]
            else:  # capacity split equally (inline: this loop runs for every resource touched)
                k = n[L]
                if not k:
                    continue  # no flows, no pair to serve: its share can wait
                new = cap[L] / k
            old = vr[L]
            if new == old:
                continue
            if na[L]:  # (else its clock is not read until it restarts)
                V[L] += old * (now - t[L])
                t[L] = now
                resched[L] = None
            vr[L] = new
            if new > old:  # thresholds below the new share: bound pairs that may move off
                up = ups[L]
                while up and up[0][0] < new:
                    e = heappop(up)
                    if e[2] == e[3].tver:
                        self._recheck(e[3], now)
            else:  # thresholds above it: pairs bound elsewhere that may move here
                lo = los[L]
                neg = -new
                while lo and lo[0][0] < neg:
                    e = heappop(lo)
                    if e[2] == e[3].tver:
                        self._recheck(e[3], now)
        pending = self._pending
        if pending:
            for p in pending:
                if p.flows:  # (one withdrawn before now has none)
                    s, d = p.src, p.dst
                    if vr[s] <= vr[d]:
                        self._bind(p, s, d, 0.0, now)
                    else:
                        self._bind(p, d, s, 0.0, now)
            pending.clear()
        if resched:
            heap = self._heap
            dues, rver, rdue = self._due, self._rver, self._rdue
            seq = self._seq
            for L in resched:
                h = dues[L]
                while h and h[0][2] != h[0][3].ver:
                    heappop(h)
                if h:
                    left = h[0][0] - V[L]
                    when = t[L] + (left if left > 0.0 else 0.0) / vr[L]
                else:
                    when = _INF
                if when != rdue[L]:
                    v = rver[L] = rver[L] + 1
                    rdue[L] = when
                    if when < _INF:
                        seq += 1
                        heappush(heap, (when, seq, L, v))
            self._seq = seq
            resched.clear()
            # stale entries dropped in bulk once they outnumber the live ones (those left by
            # the last drop, and 32 more): few resources have a completion due at a time (the
            # 64-worker benchmark: ~16 of 144), and every pop from the heap costs its depth
            if len(heap) > self._heap_cap:
                heap[:] = [e for e in heap if e[3] == rver[e[2]]]
                heapq.heapify(heap)
                self._heap_cap = 2 * len(heap) + 32
        self._schedule_wake()

    def _schedule_wake(self) -> None:
        heap, rver = self._heap, self._rver
        while heap and heap[0][3] != rver[heap[0][2]]:
            heappop(heap)
        if heap and heap[0][0] < self._wake_at:
            t = heap[0][0]
            self._wake_at = t
            self._wake_timer = call_later(self.env, max(t - self.env.now, 0.0), self._wake_cb)

    def _wake(self, timer: Timer) -> None:
        """A completion is due: every resource due now (to float rounding of the wake
        time) completes its pairs due now, together: resource by resource in the order
        of their entries, and each one's pairs in the order of their targets. Their
        messages are delivered after the latency, then the shares are settled."""
        now = self.env.now
        if timer is self._wake_timer:  # the earliest pending wake: none is pending after it
            self._wake_at = _INF
        heap, rver, rdue = self._heap, self._rver, self._rdue
        horizon = now + 1e-12 * max(now, 1e-9)
        res: list[int] = []
        while heap and heap[0][0] <= horizon:
            r_ent = heappop(heap)
            L = r_ent[2]
            if r_ent[3] == rver[L]:
                rdue[L] = _INF  # consumed: the settle pushes its next one
                res.append(L)
        delivered: list[Callable[[], None]] = []
        for L in res:
            self._complete(L, now, horizon, delivered)
        # One latency timer for every message this wake delivers: the per-message timers
        # would fire back to back at the same instant (consecutive event ids), and a
        # delivery callback schedules nothing urgent that could run between them.
        if delivered:
            if self.latency_s > 0.0:
                def deliver_all(_e: object) -> None:
                    for cb in delivered:
                        cb()

                call_later(self.env, self.latency_s, deliver_all)
            else:
                for cb in delivered:
                    cb()
        if self._dirty:
            self._settle()
        else:
            self._schedule_wake()

    def _complete(self, L: int, now: float, horizon: float, delivered: list[Callable[[], None]]) -> None:
        """Resource ``L`` is due at this wake: serve its pairs whose earliest target its
        clock reaches by ``horizon`` (:meth:`_serve_due`), appending their flows'
        callbacks to ``delivered``; then bring its clock and counts up to ``now``.

        The due pairs are served as their entries come off, each in turn (the order of
        their pops), and a pair with flows left gets its next entry at once: in place of
        the one consumed (heapreplace: one sift, not a pop's and a push's), or with many
        due at once, after them. That entry is never due in this wake (its target is
        beyond lim >= vlim, and first is spent), so the entries taken are the same. Many
        due at once (a shard's chunk to every worker: equal sizes, one target): the
        entries are taken in sorted order, the order of their pops (their keys are unique,
        so which heap arrangement is left does not matter), and the rest, still sorted, is
        a heap. A heap filled in key order is sorted already, and sorting it costs a
        comparison an entry against a pop's ~log2(n).

        Under the capacity policy the settle skips a resource left without flows (it
        keeps its share until one comes, which marks it again), so one is marked only
        where _refresh sets the shares (a shard's chunk to every worker leaves each
        worker's downlink idle: that many marks, set entries and settle iterations less).
        """
        h = self._due[L]
        tL, VL, r = self._t[L], self._V[L], self._vr[L]
        before = len(delivered)
        # The first pair is due by construction when the resource is unchanged since
        # its entry was made (the same numbers gave that time). Never judge it by the
        # clock: rounding could leave it a hair short forever.
        idle = self._serve_due(h, VL + (horizon - tL) * r, L not in self._resched, delivered.append)
        done = len(delivered) - before  # flows delivered
        if not done:
            return
        self._V[L] = VL + r * (now - tL)
        self._t[L] = now
        self._resched[L] = None
        self._dirty.add(L)
        self._n[L] -= done
        if idle:  # (na[L] reaches 0 only once every due pair is idle: no entry pushed since)
            na = self._na
            na[L] -= idle
            if not na[L]:
                h.clear()

    def _serve_due(self, h: list[tuple[float, int, int, _Pair]], vlim: float, first: bool,
                   deliver: Callable[[Callable[[], None]], None]) -> int:
        """Serve the pairs of a resource's completion heap ``h`` that are due: those whose
        earliest target its clock reaches by the wake's horizon (``vlim`` on that clock),
        the first one regardless with ``first``; ``deliver`` their flows' callbacks.
        Returns how many pairs were left without flows (see :meth:`_complete`). A due
        pair delivers its flows the clock reaches by the horizon (the module docstring's
        Completions; not a tolerance relative to the pair's service since it started,
        which grows with a pair that never drains and then delivers flows early).
        """
        n, dirty, refresh, pop = self._n, self._dirty, self._cap is None, heappop
        many = len(h) > 4 and h[-1][0] <= vlim
        if many:
            h.sort()
            m = len(h)
            back: list[tuple[float, int, int, _Pair]] = []  # next entries, pushed after
        i = idle = 0  # (many: the entries before h[i] are consumed); pairs left without flows
        while True:
            if many:
                if i == m:
                    break
                e = h[i]
            elif h:
                e = h[0]
            else:
                break
            p = e[3]
            if e[2] != p.ver:  # stale
                if many:
                    i += 1
                else:
                    pop(h)
                continue
            if not (e[0] <= vlim or first):
                break
            first = False
            flows = p.flows
            first_t, _, cb = pop(flows)
            deliver(cb)
            o = p.o
            nxt = None  # its next entry (None: idle, see _idle; its entry is gone)
            if not flows:  # its only flow (the common case)
                left = n[o] = n[o] - 1
                if left or refresh:  # (see _complete)
                    dirty.add(o)
                idle += 1
            else:
                dirty.add(o)
                lim = vlim if vlim > first_t else first_t  # (>= 0: vlim is)
                # the ulp only where the next flow is near: lim * (1 + 1e-9) + 1e-300 is above
                # lim + 4 ulp(lim) for every lim >= 0, so a next flow beyond it is not due
                if flows[0][0] <= lim * 1.000000001 + 1e-300:
                    lim += 4.0 * math.ulp(lim)
                    k = 1
                    while flows and flows[0][0] <= lim:
                        deliver(pop(flows)[2])
                        k += 1
                    n[o] -= k
                    if flows:
                        f = flows[0]
                        nxt = (f[0], f[1], p.ver, p)
                    else:
                        idle += 1
                else:  # (the common case: the earliest flow alone, others left)
                    n[o] -= 1
                    f = flows[0]
                    nxt = (f[0], f[1], p.ver, p)
            if many:  # its entry consumed (the pair's ver stays for its next one)
                i += 1
                if nxt is not None:
                    back.append(nxt)
            elif nxt is not None:
                heapreplace(h, nxt)
            else:
                pop(h)
        if many:
            del h[:i]
            for e in back:
                heappush(h, e)
        return idle


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
        # a link's bandwidth split equally among its flows: FluidShare's default policy
        super().__init__(env, len(link_bw_Bps), latency_s, capacity=link_bw_Bps)
        self.bw = [float(b) for b in link_bw_Bps]
        self.fair = fair
        if fair:
            # a message is a flow: transfer is _add itself (one call less per message, the
            # network's most frequent entry; the pair it returns is not needed)
            self.transfer = self._add  # type: ignore[method-assign,assignment]
            self.transfer_many = self._start_many  # type: ignore[method-assign,assignment]

    def transfer(self, src: int, dst: int, nbytes: float, on_delivered: Callable[[], None]) -> None:
        """Send ``nbytes`` from link ``src`` to link ``dst``; call ``on_delivered`` on arrival
        (with ``fair`` sharing, :meth:`FluidShare._add`)."""
        if nbytes <= 0:
            self._deliver(on_delivered)
            return
        call_later(self.env, nbytes / min(self.bw[src], self.bw[dst]), lambda _e: self._deliver(on_delivered))

    def transfer_many(self, src: int, messages: Iterable[tuple[int, float, Callable[[], None]]]) -> None:
        """:meth:`transfer` from ``src`` of each ``(dst, nbytes, on_delivered)`` of ``messages``
        in turn (with ``fair`` sharing, :meth:`FluidShare._start_many`)."""
        for dst, nbytes, on_delivered in messages:
            self.transfer(src, dst, nbytes, on_delivered)
