"""Embedded board profiles (robotics, issue 8): several compute units sharing one
memory, with power modes.

A board file is ``hardware_profiles/boards/NAME.json``. It lists

* ``units``: the board's schedulable compute units (CPU clusters, the GPU, DLAs),
  each with the per-unit fields of a device profile (peak FLOP/s per dtype,
  the bandwidth the unit can draw from the shared memory, launch overhead,
  efficiency per op class, idle power) and the op classes it can run at all
  (a DLA runs convolutions and GEMMs, not a particle filter);
* ``power_modes``: for each mode (an ``nvpmodel`` setting), its power cap and,
  per unit, the speed the mode's clocks give relative to the unit's peak
  (0 = the unit is offline in that mode) and the power it draws when busy;
* the shared memory's bandwidth and the cost of handing data from one unit to
  another through it.

The cost model sees one unit in one mode as an ordinary
:class:`~hardware_profiles.schema.DeviceProfile` (:meth:`Board.unit_profile`),
so robotics tasks and DNN layers are priced by the same formula.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from hardware_profiles import _validation_error
from hardware_profiles.errors import ConfigError
from hardware_profiles.schema import OP_CLASSES, DeviceProfile, Power, Source, _Strict

BOARDS_DIR = Path(__file__).resolve().parent / "boards"

#: A mode's busy units may draw this much over its cap before the file is refused:
#: the per-unit figures are estimates, the cap is the vendor's.
CAP_SLACK = 1.02


class UnitSpec(_Strict):
    """One compute unit of a board, at the speed of its fastest mode (speed 1.0)."""

    kind: Literal["cpu", "gpu", "accel"]
    cores: int = Field(1, ge=1, description="cores or SMs (documentation only)")
    peak_flops: dict[str, float] = Field(description="peak FLOP/s per dtype at speed 1.0; fp32 required")
    mem_bw_Bps: float = Field(gt=0, description="bandwidth this unit can draw from the shared memory")
    launch_overhead_s: float = Field(ge=0, description="fixed cost of one kernel launch / op dispatch")
    efficiency: dict[str, float] = Field(default_factory=dict,
                                         description="fraction of peak per op class (missing: 1.0)")
    supports: list[str] | None = Field(None, description="op classes it can run (null: all)")
    idle_w: float = Field(ge=0, description="watts when online and idle")

    @model_validator(mode="after")
    def _check(self) -> UnitSpec:
        if "fp32" not in self.peak_flops or any(not v > 0 for v in self.peak_flops.values()):
            raise ValueError("peak_flops must contain 'fp32' and every value must be > 0")
        for k in list(self.efficiency) + list(self.supports or []):
            if k not in OP_CLASSES:
                raise ValueError(f"unknown op class {k!r} (known: {', '.join(OP_CLASSES)})")
        if any(not 0 < v <= 1 for v in self.efficiency.values()):
            raise ValueError("efficiency values must be in (0, 1]")
        return self


class UnitMode(_Strict):
    speed: float = Field(ge=0, le=1, description="clock-derived speed relative to speed 1.0 (0: offline)")
    active_w: float = Field(ge=0, description="watts when busy in this mode")


class PowerMode(_Strict):
    power_cap_w: float = Field(gt=0, description="the mode's power budget (nvpmodel)")
    mem_bw_scale: float = Field(1.0, gt=0, le=1, description="memory clock relative to the maximum")
    base_w: float = Field(ge=0, description="board power not attributed to units (SoC uncore, DRAM, IO)")
    units: dict[str, UnitMode]


class Board(_Strict):
    """An embedded board (schema 1)."""

    schema_: Literal[1] = Field(1, alias="schema")
    name: str = Field(min_length=1)
    memory_bytes: float = Field(gt=0, description="shared memory")
    mem_bw_Bps: float = Field(gt=0, description="shared memory bandwidth at the highest memory clock")
    transfer_latency_s: float = Field(ge=0, description="fixed cost of handing a buffer between units")
    units: dict[str, UnitSpec]
    power_modes: dict[str, PowerMode]
    source: Source
    _profiles: dict[tuple[str, str], DeviceProfile] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Board:
        if not self.units or not self.power_modes:
            raise ValueError("a board needs at least one unit and one power mode")
        for m, pm in self.power_modes.items():
            if set(pm.units) != set(self.units):
                raise ValueError(f"power mode {m!r} must list every unit ({', '.join(self.units)})")
            if not any(u.speed > 0 for u in pm.units.values()):
                raise ValueError(f"power mode {m!r} has no online unit")
            for u, um in pm.units.items():
                if um.speed > 0 and um.active_w < self.units[u].idle_w:
                    raise ValueError(f"power mode {m!r}: unit {u!r} active_w below its idle_w")
            full = pm.base_w + sum(um.active_w for um in pm.units.values())
            if full > pm.power_cap_w * CAP_SLACK:
                raise ValueError(f"power mode {m!r}: all units busy draw {full:g} W, "
                                 f"over its cap of {pm.power_cap_w:g} W")
        return self

    def online(self, mode: str) -> list[str]:
        """Units with speed > 0 in ``mode``, in file order."""
        return [u for u, um in self.power_modes[mode].units.items() if um.speed > 0]

    def unit_idle_w(self, unit: str, mode: str) -> float:
        """Idle watts of ``unit`` in ``mode`` (0 when the mode powers it off)."""
        return self.units[unit].idle_w if self.power_modes[mode].units[unit].speed > 0 else 0.0

    def idle_w(self, mode: str) -> float:
        """Board power with every online unit idle."""
        pm = self.power_modes[mode]
        return pm.base_w + sum(self.unit_idle_w(u, mode) for u in self.units)

    def transfer_s(self, nbytes: float, mode: str) -> float:
        """Handing ``nbytes`` from one unit to another: a write and a read of the shared memory."""
        if nbytes <= 0:
            return 0.0
        return self.transfer_latency_s + 2.0 * nbytes / (self.mem_bw_Bps * self.power_modes[mode].mem_bw_scale)

    def unit_profile(self, unit: str, mode: str) -> DeviceProfile:
        """``unit`` in ``mode`` as a device profile for the cost model (speed-scaled peaks,
        memory bandwidth capped by the mode's memory clock). Built once per (unit, mode)."""
        if (unit, mode) not in self._profiles:
            self._profiles[unit, mode] = self._make_profile(unit, mode)
        return self._profiles[unit, mode]

    def _make_profile(self, unit: str, mode: str) -> DeviceProfile:
        spec, pm = self.units[unit], self.power_modes[mode]
        um = pm.units[unit]
        if um.speed <= 0:
            raise ValueError(f"unit {unit!r} is offline in power mode {mode!r}")
        return DeviceProfile(
            name=f"{self.name}.{unit}", kind=spec.kind,
            peak_flops={k: v * um.speed for k, v in spec.peak_flops.items()},
            mem_bw_Bps=min(spec.mem_bw_Bps, self.mem_bw_Bps * pm.mem_bw_scale),
            memory_bytes=self.memory_bytes, launch_overhead_s=spec.launch_overhead_s / um.speed,
            efficiency=dict(spec.efficiency), nic_bw_Bps=1.25e8, price_per_hour=0.0,
            power_w=Power(idle=spec.idle_w, active=um.active_w), source=self.source)

    def supports(self, unit: str, op: str) -> bool:
        s = self.units[unit].supports
        return s is None or op in s


@functools.lru_cache(maxsize=64)
def _load_cached(resolved: str, mtime_ns: int) -> Board:
    del mtime_ns
    try:
        data = json.loads(Path(resolved).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(resolved, "", f"cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(resolved, "", f"invalid JSON: {e}") from None
    try:
        board = Board.model_validate(data)
    except ValidationError as e:
        raise ConfigError(resolved, *_validation_error(e)) from None
    if board.name != Path(resolved).stem:
        raise ConfigError(resolved, "name", f"'{board.name}' differs from the file name")
    return board


def load_board(name_or_path: str | os.PathLike[str]) -> Board:
    """A board by name (``hardware_profiles/boards/NAME.json``) or by path to a JSON file.

    Raises:
        ConfigError: naming the file and the field, for an unknown board or a bad file.
    """
    p = Path(name_or_path)
    if p.suffix != ".json":
        p = BOARDS_DIR / f"{name_or_path}.json"
        if not p.is_file():
            raise ConfigError("<board>", "board", f"unknown board {os.fspath(name_or_path)!r}; "
                              f"known: {', '.join(list_boards())}")
    if not p.is_file():
        raise ConfigError(os.fspath(name_or_path), "", "no such file")
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)


def list_boards() -> list[str]:
    return sorted(p.stem for p in BOARDS_DIR.glob("*.json"))
