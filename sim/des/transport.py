"""Messages between the data-parallel job's processes: links, hosts' copies, wake-ups, turns.

Processes are the workers ``0..N-1`` then the PS shards ``N..N+S-1``; each has an
uplink and a downlink on the :class:`~sim.des.network.FlowNetwork` (link ids:
worker up ``w``, worker down ``N+w``, shard up ``2N+s``, shard down ``2N+S+s``).
A process placed on a host (``cluster.hosts``) also has that host's cores
(:class:`~sim.des.hosts.HostCPU`), which its compute shares; a host can add to
each message a CPU cost (``copy_Bps``) and a wake-up latency (``wake_s``), and a
runtime emulation (:class:`~sim.emulation.RuntimeEmulation`) one message at a
time per link (``serial_messages``) and each process's CPU scales: see
:meth:`Transport.send`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

import simpy

from sim.cluster import Placement
from sim.costmodel import PlanCosts
from sim.des.hosts import HostCPU
from sim.des.kernel import call_later
from sim.des.network import FlowNetwork
from sim.emulation import RuntimeEmulation
from sim.problem import Problem


class _Queued:
    """A message waiting for its serial links (``RuntimeEmulation.serial_messages``): it starts once it
    heads the queue of each of them."""

    __slots__ = ("start", "queues", "started")

    def __init__(self, start: Callable[[], None], queues: tuple[collections.deque[_Queued], ...]) -> None:
        self.start, self.queues, self.started = start, queues, False

    def try_start(self) -> None:
        if self.started or any(q[0] is not self for q in self.queues):
            return
        self.started = True
        self.start()


class Transport:
    """The links and hosts of a run's processes, and how a message crosses them.

    Attributes:
        net: the network (every message crosses it).
        cpu: the hosts' cores, or None where no process is placed on a host.
        proc: each process's id on ``cpu`` (None: not placed; it computes alone).
        copier: the id on ``cpu`` of each process's copier (a host with ``copy_Bps``:
            one more thread, a process of its own on the same cores, that works on
            the process's messages' copies at ``nbytes / copy_Bps`` seconds each end,
            at the process's compute scale times its copies scale).
        msg_ends: messages with bytes each process sent or received (its ends),
            counted where messages go through the host (``host_messages``).
        host_messages: whether any message costs host CPU or wake-up time or waits
            its turn (else the network alone carries them: :meth:`send` need not be
            called, ``net.transfer`` does the same).
    """

    def __init__(self, env: simpy.Environment, problem: Problem, costs: PlanCosts,
                 emulation: RuntimeEmulation | None = None) -> None:
        self.env = env
        N, S = len(costs.workers), len(costs.shards)
        self.N = N
        bw = list(costs.worker_bw) * 2 + list(costs.shard_bw) * 2
        self.net = FlowNetwork(env, bw, costs.latency_s, fair=problem.cluster.network.sharing == "fair")
        cl = problem.cluster
        placed = [cl.placed(d) for d in (*costs.workers, *costs.shards)]
        self.cpu: HostCPU | None = None
        self.proc: list[int | None] = [None] * (N + S)
        self.copier: list[int | None] = [None] * (N + S)
        # a message's receiver on a host with wake_s: that host and its wake-up latency
        self.wake_at: list[tuple[int, float] | None] = [None] * (N + S)
        self.copy_s_per_B: list[float] = [0.0] * (N + S)
        self.msg_ends: list[int] = [0] * (N + S)
        ids = (*costs.workers, *costs.shards)
        if any(pl is not None for pl in placed):
            self._place(problem, placed, ids, emulation or RuntimeEmulation())
        # Serial messages (an emulation's serial_messages): each placed process's links carry
        # one message at a time, first issued first served; a message starts once it heads
        # the queue of both its links (see send).
        self.link_queue: list[collections.deque[_Queued] | None] = [None] * (2 * N + 2 * S)
        serial = emulation is not None and emulation.serial_messages
        for i, pl in enumerate(placed):
            if pl is not None and serial:
                ups = (i, N + i) if i < N else (2 * N + (i - N), 2 * N + S + (i - N))
                for link in ups:
                    self.link_queue[link] = collections.deque()
        self.host_messages = any(x is not None for x in (*self.copier, *self.wake_at, *self.link_queue))

    def _place(self, problem: Problem, placed: list[Placement | None], devices: tuple[str, ...],
               emulation: RuntimeEmulation) -> None:
        """The processes placed on hosts (``placed``: each one's placement or None; ``devices``:
        each one's device id), their copiers and their hosts' wake-up latencies, on one
        :class:`HostCPU`, each at its CPU scale in ``emulation``."""
        cl = problem.cluster
        ids = [i for i, pl in enumerate(placed) if pl is not None]
        procs = [pl for pl in placed if pl is not None]
        scales = [emulation.cpu_scale(devices[i]).compute for i in ids]
        for k, i in enumerate(ids):
            self.proc[i] = k
        for i in ids:
            pl = placed[i]
            assert pl is not None
            rate = cl.hosts[pl.host].copy_Bps
            if rate > 0:
                s = emulation.cpu_scale(devices[i])
                self.copier[i] = len(procs)
                self.copy_s_per_B[i] = 1.0 / rate
                procs.append(dataclasses.replace(pl, threads=1))
                scales.append(s.compute * s.copies)
        self.cpu = HostCPU(self.env, cl.hosts, procs, scales)
        for i in ids:
            pl = placed[i]
            assert pl is not None
            if cl.hosts[pl.host].wake_s > 0:
                self.wake_at[i] = (pl.host, cl.hosts[pl.host].wake_s)

    def send(self, src: int, dst: int, src_link: int, dst_link: int, nbytes: float,
             delivered: Callable[[], None], started: Callable[[], None] | None = None) -> None:
        """A message from process ``src`` to ``dst`` (workers 0..N-1, shards N..):
        over the network, and where an end sits on a host with ``copy_Bps``, also
        ``nbytes / copy_Bps`` seconds of CPU on that host for the end's copy (the
        sender's into the transport, the receiver's out of it), competing for its
        cores like any compute. The three run side by side (as a message holds both
        its links at once); ``delivered`` when all are done. Where the receiver sits on a
        host with ``wake_s`` whose cores are all busy at that moment, it gets the message
        ``wake_s`` later (it waits for a core to be woken on).

        Where a link is serial (its process is placed and the emulation has
        ``serial_messages``), the message
        first waits until every earlier message on that link is delivered: it joins the
        queues of both its links at once and starts when it heads both, so messages start
        in the order they were issued and two never wait for each other. ``started`` (if
        given) is called when the message starts: at once, or once it heads its queues."""
        qa, qb = self.link_queue[src_link], self.link_queue[dst_link]
        if qa is not None or qb is not None:
            first = delivered

            def done() -> None:
                for q in (qa, qb):
                    if q is not None:
                        q.popleft()  # a running message heads its queues
                first()
                for q in (qa, qb):
                    if q:
                        q[0].try_start()

            def go() -> None:
                if started is not None:
                    started()
                self._send_now(src, dst, src_link, dst_link, nbytes, done)

            msg = _Queued(go, tuple(q for q in (qa, qb) if q is not None))
            for q in msg.queues:
                q.append(msg)
            msg.try_start()
            return
        if started is not None:
            started()
        self._send_now(src, dst, src_link, dst_link, nbytes, delivered)

    def _send_now(self, src: int, dst: int, src_link: int, dst_link: int, nbytes: float,
                  delivered: Callable[[], None]) -> None:
        """:meth:`send` once the message may go: the network, the copies and the wake-up."""
        if nbytes > 0:
            ends = self.msg_ends
            ends[src] += 1
            ends[dst] += 1
        if self.wake_at[dst] is not None:
            host, wake_s = self.wake_at[dst]  # type: ignore[misc]
            assert self.cpu is not None
            busy, env, arrived = self.cpu.busy, self.env, delivered

            def delivered() -> None:
                if busy(host):
                    call_later(env, wake_s, lambda _ev: arrived())
                else:
                    arrived()
        copier = self.copier
        a, b = copier[src], copier[dst]
        if (a is None and b is None) or nbytes <= 0:
            self.net.transfer(src_link, dst_link, nbytes, delivered)
            return
        cpu = self.cpu
        assert cpu is not None
        left = 1 + (a is not None) + (b is not None)

        def one() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                delivered()

        self.net.transfer(src_link, dst_link, nbytes, one)
        if a is not None:
            cpu.compute(a, nbytes * self.copy_s_per_B[src], one)
        if b is not None:
            cpu.compute(b, nbytes * self.copy_s_per_B[dst], one)
