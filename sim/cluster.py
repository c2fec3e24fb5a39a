"""Clusters: device instances (from profiles), PS shards and the network."""

from __future__ import annotations

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
class Cluster:
    """The inventory: every worker-capable device, the PS shards, the network."""

    devices: tuple[Device, ...]
    shards: tuple[Device, ...]
    network: Network

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices + self.shards})

    def device(self, device_id: str) -> Device:
        return self._by_id[device_id]  # type: ignore[attr-defined]

    def has(self, device_id: str) -> bool:
        return device_id in self._by_id  # type: ignore[attr-defined]

    @property
    def types(self) -> dict[str, DeviceType]:
        """Worker device types by name, in inventory order."""
        out: dict[str, DeviceType] = {}
        for d in self.devices:
            out.setdefault(d.type.name, d.type)
        return out
