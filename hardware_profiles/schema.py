"""Device profile format (schema 1): what a device type can do and what it costs.

A profile is a JSON file, ``hardware_profiles/NAME.json`` or in a folder named
by a config's ``profiles:``. Datasheet profiles carry vendor figures; measured
profiles (``hetsim profile``) add per-layer tables and network measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

OP_CLASSES = ("gemm", "conv", "embedding", "elementwise", "attention")
DTYPES = ("fp32", "fp16", "bf16", "int8")


class _Strict(BaseModel):
    # allow_inf_nan=False: Python's json module accepts NaN and Infinity, and an
    # infinite bandwidth or peak would silently make every cost zero.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EfficiencyCurve(_Strict):
    """Achieved fraction of peak FLOP/s as a function of the work of one call.

    Piecewise linear in log10(flops), clamped at both ends.
    """

    flops: list[float] = Field(description="FLOPs of one call (one layer on one batch), increasing")
    eff: list[float] = Field(description="fraction of peak at each point, in (0, 1.5]")

    @model_validator(mode="after")
    def _check(self) -> EfficiencyCurve:
        if len(self.flops) != len(self.eff) or not self.flops:
            raise ValueError("flops and eff must be non-empty lists of equal length")
        if any(f <= 0 for f in self.flops) or any(b <= a for a, b in pairwise(self.flops)):
            raise ValueError("flops must be positive and strictly increasing")
        if any(not 0 < e <= 1.5 for e in self.eff):
            raise ValueError("eff values must lie in (0, 1.5]")
        return self

    def at(self, flops: float) -> float:
        """Efficiency for one call of ``flops`` FLOPs."""
        if flops <= self.flops[0]:
            return self.eff[0]
        if flops >= self.flops[-1]:
            return self.eff[-1]
        x = math.log10(flops)
        xs = [math.log10(f) for f in self.flops]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return self.eff[i - 1] + w * (self.eff[i] - self.eff[i - 1])
        return self.eff[-1]  # pragma: no cover (guarded above)


def _efficiency_kind(v: Any) -> str:
    return "curve" if isinstance(v, dict | EfficiencyCurve) else "const"


# One op class's efficiency: a constant or a curve. A callable discriminator
# (rather than a plain union) makes pydantic report only the member that was
# meant, at ``efficiency.<op>.<tag>...``; error_field() drops the tag.
_EFFICIENCY_TAGS = ("const", "curve")
Efficiency = Annotated[
    Annotated[float, Field(gt=0, le=1.5), Tag("const")]
    | Annotated[EfficiencyCurve, Tag("curve")],
    Discriminator(_efficiency_kind),
]


def error_field(loc: Sequence[int | str]) -> str:
    """Dotted field path of a pydantic error location, e.g. 'efficiency.gemm.eff'.

    Drops the union tag that pydantic inserts after an efficiency entry.
    """
    parts = [str(p) for p in loc]
    if len(parts) >= 3 and parts[0] == "efficiency" and parts[2] in _EFFICIENCY_TAGS:
        del parts[2]
    return ".".join(parts)


class LayerTable(_Strict):
    """Measured forward/backward seconds of one layer signature at several batch sizes."""

    batch: list[int]
    fwd_s: list[float]
    bwd_s: list[float]

    @model_validator(mode="after")
    def _check(self) -> LayerTable:
        n = len(self.batch)
        if n == 0 or len(self.fwd_s) != n or len(self.bwd_s) != n:
            raise ValueError("batch, fwd_s and bwd_s must be non-empty lists of equal length")
        if any(b <= 0 for b in self.batch) or any(b2 <= b1 for b1, b2 in pairwise(self.batch)):
            raise ValueError("batch must be positive and strictly increasing")
        if any(t < 0 for t in self.fwd_s + self.bwd_s):
            raise ValueError("times must be >= 0")
        return self


class Power(_Strict):
    idle: float = Field(ge=0, description="watts drawn when idle")
    active: float = Field(ge=0, description="watts drawn at full utilization")

    @model_validator(mode="after")
    def _check(self) -> Power:
        if self.active < self.idle:
            raise ValueError("active power must be >= idle power")
        return self


class Source(BaseModel):
    """Provenance of the figures: datasheet or measured (device, torch version, date)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["datasheet", "measured"]
    note: str = ""
    date: str = ""


class NetworkMeasurement(BaseModel):
    """Measured point-to-point / all-reduce figures (free-form beyond these keys)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    p2p_bw_Bps: float | None = None
    p2p_latency_s: float | None = None


class DeviceProfile(_Strict):
    """One device type (schema 1). Units are in the field names; time in seconds."""

    schema_: Literal[1] = Field(1, alias="schema", description="format version")
    name: str = Field(min_length=1, description="type name used in configs, e.g. 'v100'")
    kind: Literal["cpu", "gpu", "accel"]
    peak_flops: dict[str, float] = Field(description="peak FLOP/s per dtype; fp32 required")
    mem_bw_Bps: float = Field(gt=0, description="memory bandwidth, bytes/s")
    memory_bytes: float = Field(gt=0, description="device memory, bytes")
    launch_overhead_s: float = Field(ge=0, description="fixed cost of one kernel launch")
    efficiency: dict[str, Efficiency] = Field(
        default_factory=dict, description="fraction of peak per op class (missing: 1.0)"
    )
    nic_bw_Bps: float = Field(gt=0, description="network interface bandwidth, bytes/s")
    price_per_hour: float = Field(ge=0, description="USD per hour, on demand")
    power_w: Power
    source: Source
    layers: dict[str, LayerTable] | None = Field(
        default=None, description="measured per-layer tables keyed by Layer.signature"
    )
    network: NetworkMeasurement | None = None
    spread: dict[str, Any] | None = Field(default=None, description="measurement spread (measured only)")
    raw: dict[str, Any] | None = Field(default=None, description="raw measurements (measured only)")

    @field_validator("peak_flops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if "fp32" not in v:
            raise ValueError("must contain 'fp32'")
        for k, x in v.items():
            if k not in DTYPES:
                raise ValueError(f"unknown dtype {k!r} (known: {', '.join(DTYPES)})")
            if not x > 0:
                raise ValueError(f"{k} must be > 0")
        return v

    @field_validator("efficiency")
    @classmethod
    def _eff(cls, v: dict[str, Any]) -> dict[str, Any]:
        for k in v:
            if k not in OP_CLASSES:
                raise ValueError(f"unknown op class {k!r} (known: {', '.join(OP_CLASSES)})")
        return v

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; bf16 and fp16 stand in for each other, else fp32."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        alt = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
        if alt and alt in self.peak_flops:
            return self.peak_flops[alt]
        return self.peak_flops["fp32"]

    def eff(self, op: str, flops: float) -> float:
        """Fraction of peak for one call of ``flops`` FLOPs of op class ``op``."""
        e = self.efficiency.get(op)
        if e is None:
            return 1.0
        if isinstance(e, EfficiencyCurve):
            return e.at(flops)
        return float(e)
