"""Clusters: device instances (from profiles), PS shards, the network and the hosts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hardware_profiles import DeviceProfile

#: A device type is its validated profile.
DeviceType = DeviceProfile


@dataclass(frozen=True)
class Device:
    """One device instance.

    Attributes:
        id: 'TYPE:K' for workers (K counts within the type), 'ps:K' for shards.
        type: its profile.
        nic_bw_Bps: bandwidth of its network interface (each direction).
    """

    id: str
    type: DeviceType
    nic_bw_Bps: float


@dataclass(frozen=True)
class Network:
    """Latency of a message and whether flows share link bandwidth."""

    latency_s: float
    sharing: str = "fair"  # fair | none


@dataclass(frozen=True)
class Node:
    """A machine holding some of the devices (``cluster.nodes``): how they reach each
    other inside it and how it reaches the other nodes (see :mod:`sim.collective`).

    Attributes:
        name: its name.
        devices: the ids of the devices it holds, in config order.
        intra_bw_Bps: bytes/s of each device's link inside the node, per direction.
        intra_latency_s: one-way latency of a message inside the node.
        nic_bw_Bps: bytes/s of the node's NIC, per direction.
        nic_latency_s: one-way latency of a message between nodes.
    """

    name: str
    devices: tuple[str, ...]
    intra_bw_Bps: float
    intra_latency_s: float
    nic_bw_Bps: float
    nic_latency_s: float


@dataclass(frozen=True)
class Host:
    """A machine whose cores the processes placed on it share (``cluster.hosts``).

    Attributes:
        name: the name placements refer to.
        cores: cores the processes may run on (indices 0 .. cores - 1).
        background_threads: runnable threads of other jobs, always competing on
            every core (a load average; may be fractional).
        copy_Bps: bytes per second one core moves into or out of a process for a
            message (a loopback transfer is copies on the cores, not a NIC's DMA):
            each end of a message costs its process ``bytes / copy_Bps`` seconds of
            CPU on this host. 0: messages cost no CPU.
        wake_s: seconds a process waits for a core after a message arrives for it
            while every core of this host is busy (as many runnable threads as
            cores or more): the OS scheduler's wake-up latency. 0: none.
    """

    name: str
    cores: int
    background_threads: float = 0.0
    copy_Bps: float = 0.0
    wake_s: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Where one process (a worker's or a PS shard's) runs.

    Attributes:
        host: index into :attr:`Cluster.hosts`.
        threads: compute threads of the process (torch intra-op threads): the
            runnable threads it adds while it computes, and the most cores it can use.
        affinity: core indices it may run on (None: every core of the host).
    """

    host: int
    threads: int = 1
    affinity: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Cluster:
    """The inventory: every worker-capable device, the PS shards, the network.

    ``hosts`` and ``placement`` (device id -> :class:`Placement`) are empty unless
    the config has ``cluster.hosts``; a device without a placement has its
    compute to itself, as every device has without hosts. ``nodes`` are empty
    unless the config has ``cluster.nodes``; a device in no node is on the flat
    network (its own link, :attr:`Device.nic_bw_Bps`).
    """

    devices: tuple[Device, ...]
    shards: tuple[Device, ...]
    network: Network
    hosts: tuple[Host, ...] = ()
    placement: tuple[tuple[str, Placement], ...] = ()
    nodes: tuple[Node, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices + self.shards})
        object.__setattr__(self, "_placed", dict(self.placement))

    def placed(self, device_id: str) -> Placement | None:
        """The host placement of a device's process, None when it has none."""
        return self._placed.get(device_id)  # type: ignore[attr-defined, no-any-return]

    def device(self, device_id: str) -> Device:
        return self._by_id[device_id]  # type: ignore[attr-defined]

    def has(self, device_id: str) -> bool:
        return device_id in self._by_id  # type: ignore[attr-defined]

    def host_stretch(self, devices: Sequence[str]) -> list[float]:
        """Per device of ``devices``, 1 / its threads' fair share of its host's cores with
        every hosted process of ``devices`` runnable at once (:func:`thread_rates`); 1.0
        for a device without a host. The analytic evaluators' steady-state view of
        ``hosts``; the DES shares the cores as the work comes and goes."""
        out = [1.0] * len(devices)
        placed = [(k, pl) for k, d in enumerate(devices) if (pl := self.placed(d)) is not None]
        for h, host in enumerate(self.hosts):
            mine = [(k, pl) for k, pl in placed if pl.host == h]
            if mine:
                rates = thread_rates(host.cores, host.background_threads, [(pl.affinity, pl.threads) for _, pl in mine])
                for (k, _), r in zip(mine, rates):
                    out[k] = 1.0 / r
        return out

    @property
    def types(self) -> dict[str, DeviceType]:
        """Worker device types by name, in inventory order."""
        out: dict[str, DeviceType] = {}
        for d in self.devices:
            out.setdefault(d.type.name, d.type)
        return out


def thread_rates(cores: int, background_threads: float,
                 groups: Sequence[tuple[tuple[int, ...] | None, float]]) -> list[float]:
    """Max-min fair CPU share per runnable thread on one host, per group.

    Each group is ``(affinity, threads)``: that many runnable threads allowed on
    those cores (None: all). ``background_threads`` more run anywhere. Cores are
    processor-sharing servers and a thread migrates freely within its affinity
    (a fluid model of the kernel's fair scheduler with load balancing), so the
    fair allocation is found by progressive filling: the set of cores S with the
    smallest ``|S| / (threads allowed only on S)`` saturates first; its threads
    get that ratio (at most 1: a thread uses one core at most), S and its threads
    leave, repeat. Candidate sets are the unions of the groups' affinities, so the
    cost grows as 2^(distinct affinities); a host has a handful.

    Returns:
        the rate of one thread of each group, in (0, 1]: the fraction of a core it
        gets, i.e. the speed of a compute that takes 1 s alone on an idle host.
    """
    full = (1 << cores) - 1
    masks = [full if aff is None else sum(1 << c for c in aff) & full for aff, _ in groups]
    if any(m == 0 for m in masks):
        raise ValueError(f"an affinity names no core of a {cores}-core host")
    counts = [float(n) for _, n in groups]
    if background_threads > 0:
        masks.append(full)
        counts.append(float(background_threads))
    rates = [1.0] * len(masks)
    left = [i for i in range(len(masks)) if counts[i] > 0]
    avail = full
    while left:
        unions = {0}
        for m in {masks[i] & avail for i in left}:
            unions |= {u | m for u in unions}
        best, best_ratio = 0, float("inf")
        for s in sorted(unions):
            n = sum(counts[i] for i in left if masks[i] & avail & ~s == 0)
            if n <= 0:
                continue
            ratio = bin(s).count("1") / n
            # ties: the larger set (a union of tight sets is tight)
            if ratio < best_ratio * (1 - 1e-12) or (ratio <= best_ratio * (1 + 1e-12)
                                                    and bin(s).count("1") > bin(best).count("1")):
                best, best_ratio = s, ratio
        r = min(1.0, best_ratio)
        if r >= 1.0:
            break  # everyone left gets a whole core per thread
        done = [i for i in left if masks[i] & avail & ~best == 0]
        for i in done:
            rates[i] = r
        left = [i for i in left if i not in done]
        avail &= ~best
    return rates[: len(groups)]
