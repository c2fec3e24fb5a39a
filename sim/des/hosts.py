"""Hosts' cores as a fluid resource: the processes placed on a host share its CPUs.

A compute (a worker's forward or backward group, a PS shard's aggregation or
update) of ``work_s`` seconds - its time alone on an idle host - is a flow
of ``work_s`` on the machinery of :class:`sim.des.network.FluidShare`, from
its host's resource to its process's resource. While it runs, its process
adds ``threads`` runnable threads to the host; the host's
``background_threads`` are always runnable. Every start and end re-rates the
host's flows: each runs at the fair CPU share of one of its threads,
:func:`sim.cluster.thread_rates` (cores as processor-sharing servers, a
thread on its affinity's cores only, at most one core per thread). A flow's
speed is that share (1.0 = as fast as alone), so ``threads`` changes how
much a process competes, not how its own work scales: a profile's time is
the process's time alone with its threads.

A process waiting for a message, or sleeping in an emulated slowdown, has no
flow and competes for nothing. The DES (sim/des/transport.py) also places here,
for each process on a host with ``copy_Bps``, a one-thread copier process on the
same cores that works on its messages' copies, at its placement's ``cpu_scale``
times ``copy_scale``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from sim.cluster import Host, Placement, thread_rates
from sim.des.network import FluidShare, _Pair


class HostCPU(FluidShare):
    """The cores of ``hosts``, shared by the processes ``procs`` (index = process id).

    Resources: host h is resource h, process i is resource ``len(hosts) + i``.
    A host's resource has an infinite share; a process's share is its threads'
    fair rate, so a flow runs at ``min(inf, rate) = rate``.

    Args:
        env: the SimPy environment.
        hosts: the hosts.
        procs: each process's placement.
    """

    def __init__(self, env: simpy.Environment, hosts: Sequence[Host], procs: Sequence[Placement]) -> None:
        super().__init__(env, len(hosts) + len(procs))
        self.hosts = tuple(hosts)
        self.procs = tuple(procs)
        self._on_host: list[list[int]] = [[] for _ in hosts]
        for i, pl in enumerate(procs):
            self._on_host[pl.host].append(i)
        # the fair rates of a host depend only on which of its processes run how many
        # flows: memoised per host on that tuple (a run revisits a few states)
        self._memo: list[dict[tuple[int, ...], list[float]]] = [{} for _ in hosts]
        if any(not pl.cpu_scale > 0 for pl in procs):  # NaN too
            raise ValueError("a placement's cpu_scale must be > 0")
        # CPU seconds of the work handed to each process: its threads x its work (each
        # thread runs at the flow's speed); a compute still running at the end counts in
        # full, a cancelled one only what it got
        self.cpu_s = [0.0] * len(procs)

    def compute(self, proc: int, work_s: float, on_done: Callable[[], None]) -> tuple[_Pair, int] | None:
        """Run ``work_s`` seconds of ``proc``'s work (times its placement's ``cpu_scale``);
        ``on_done`` when it is done.

        Returns a handle for :meth:`cancel` (None: no work, ``on_done`` already called).
        """
        pl = self.procs[proc]
        work_s *= pl.cpu_scale
        if work_s <= 0:
            on_done()
            return None
        self.cpu_s[proc] += work_s * pl.threads
        return self._start(pl.host, len(self.hosts) + proc, work_s, on_done)

    def cancel(self, handle: tuple[_Pair, int]) -> float:
        """Withdraw a compute that has not finished; the work it had not been given is
        taken off its process's :attr:`cpu_s` (and returned)."""
        left = super().cancel(handle)
        proc = handle[0].dst - len(self.hosts)
        self.cpu_s[proc] -= left * self.procs[proc].threads
        return left

    def busy(self, host: int) -> bool:
        """Whether every core of ``host`` is taken now: its background threads plus the
        threads of its processes' running flows at least its cores."""
        H, n = len(self.hosts), self._n
        h = self.hosts[host]
        runnable = h.background_threads + sum(n[H + i] * self.procs[i].threads for i in self._on_host[host])
        return runnable >= h.cores

    def _refresh(self, resources: list[int]) -> list[int]:
        """The fair rates of the processes on each host in ``resources``; returns those
        processes' resources (a host's share stays infinite)."""
        H, n, share = len(self.hosts), self._n, self._share
        changed: list[int] = []
        for h in resources:
            if h >= H:
                continue  # a process's count changes with its host's: refreshed there
            mine = self._on_host[h]
            state = tuple(n[H + i] for i in mine)
            rates = self._memo[h].get(state)
            if rates is None:
                host = self.hosts[h]
                groups = [(self.procs[i].affinity, k * self.procs[i].threads) for i, k in zip(mine, state)]
                rates = self._memo[h][state] = thread_rates(host.cores, host.background_threads, groups)
            for i, r in zip(mine, rates):
                share[H + i] = r
                changed.append(H + i)
        return changed
