"""Device profile format (schema 2): what a device type can do and what it costs.

A profile is a JSON file, ``hardware_profiles/NAME.json`` or in a folder named
by a config's ``profiles:``. Datasheet profiles carry vendor figures; measured
profiles (``hetsim profile``) add per-layer tables, network measurements, the cost
model's corrections (``corrections``, :mod:`hardware_profiles.corrections`) and the
measurements they were fitted to (``measurement``). Schema 1 data (the corrections'
parameters and the measurements as top-level fields) is read and migrated
(:func:`hardware_profiles.migrate.migrate_v1`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from hardware_profiles.base import (
    OP_CLASSES,
    _Curve,
    _known_keys,
    _Strict,
    check_kind_keys,
    mem_key,
)
from hardware_profiles.corrections import Corrections
from hardware_profiles.migrate import V1_FIELDS, migrate_v1

__all__ = [
    "DTYPES",
    "OP_CLASSES",
    "QUANT_BITS",
    "RUNTIME_CPU_TERMS",
    "BandwidthCurve",
    "Corrections",
    "DeviceProfile",
    "EfficiencyCurve",
    "Efficiency",
    "IntensityCurve",
    "LayerTable",
    "Measurement",
    "NetworkMeasurement",
    "Power",
    "QuantCost",
    "RuntimeCpuFit",
    "Source",
    "error_field",
    "mem_key",
]

DTYPES = ("fp32", "tf32", "fp16", "bf16", "int8")
#: The math modes a profile may give its own efficiency table (``math_efficiency``):
#: every peak but the fp32 one, whose table is ``efficiency``.
MATH_MODES = ("tf32", "fp16", "bf16", "int8")


class _EffCurve(_Curve):
    """A curve of efficiencies (``eff``: the file's y key, written before the x key)."""

    eff: list[float]


class EfficiencyCurve(_EffCurve):
    """Achieved fraction of peak FLOP/s as a function of the work of one call."""

    _x: ClassVar[str] = "flops"
    _max: ClassVar[float] = 1.5
    flops: list[float] = Field(description="FLOPs of one call (one layer on one batch), increasing")
    eff: list[float] = Field(description="fraction of peak at each point, in (0, 1.5]")


class BandwidthCurve(_EffCurve):
    """Achieved fraction of ``mem_bw_Bps`` as a function of the bytes one call moves.

    Values above 1 are allowed: small working sets run from cache, faster than
    the DRAM bandwidth that ``mem_bw_Bps`` states.
    """

    _x: ClassVar[str] = "bytes"
    _max: ClassVar[float] = 100
    bytes: list[float] = Field(description="bytes moved by one call, increasing")
    eff: list[float] = Field(description="fraction of mem_bw_Bps at each point, in (0, 100]")


_EFF_KEY_RE = re.compile(r"^(" + "|".join(OP_CLASSES) + r")/[a-z0-9]+$")


class IntensityCurve(_EffCurve):
    """Achieved fraction of peak FLOP/s as a function of a call's arithmetic intensity.

    Intensity is FLOPs per byte the call moves (the cost model's bytes term). On
    CPUs it separates, say, a 1x1 from a 3x3 convolution of equal FLOPs, which a
    curve over FLOPs cannot.
    """

    _x: ClassVar[str] = "intensity"
    _max: ClassVar[float] = 1.5
    intensity: list[float] = Field(description="FLOPs per byte, increasing")
    eff: list[float] = Field(description="fraction of peak at each point, in (0, 1.5]")


def _efficiency_kind(v: Any) -> str:
    if isinstance(v, IntensityCurve) or (isinstance(v, dict) and "intensity" in v):
        return "intensity"
    return "curve" if isinstance(v, dict | EfficiencyCurve) else "const"


# One op class's efficiency: a constant or a curve. A callable discriminator
# (rather than a plain union) makes pydantic report only the member that was
# meant, at ``efficiency.<op>.<tag>...``; error_field() drops the tag.
_EFFICIENCY_TAGS = ("const", "curve", "intensity")
Efficiency = Annotated[
    Annotated[float, Field(gt=0, le=1.5), Tag("const")]
    | Annotated[EfficiencyCurve, Tag("curve")]
    | Annotated[IntensityCurve, Tag("intensity")],
    Discriminator(_efficiency_kind),
]


def error_field(loc: Sequence[int | str]) -> str:
    """Dotted field path of a pydantic error location, e.g. 'efficiency.gemm.eff'.

    Drops the union tag that pydantic inserts after an efficiency entry.
    """
    parts = [str(p) for p in loc]
    if len(parts) >= 3 and parts[0] in ("efficiency", "efficiency_bwd") and parts[2] in _EFFICIENCY_TAGS:
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


class QuantCost(_Strict):
    """Measured cost of the runtime's gradient (de)quantization at one bit width."""

    pack_s_per_value: float = Field(ge=0, description="sender: seconds per fp32 value packed")
    unpack_s_per_value: float = Field(ge=0, description="PS shard: seconds per value unpacked")


QUANT_BITS = ("2", "4", "8", "16")


class Source(BaseModel):
    """Provenance of the figures: ``datasheet`` (vendor figures), ``fitted`` (datasheet
    figures plus parameters fitted to published measurements: ``calibration.published``)
    or ``measured`` (``hetsim profile``: device, torch version, date)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["datasheet", "fitted", "measured"]
    note: str = ""
    date: str = ""


#: The terms of the runtime CPU model (calibration/runtime_cpu.py), in coefficient order.
RUNTIME_CPU_TERMS = ("compute", "compute_x_corunners", "transport", "messages")
_Coef = Annotated[float, Field(ge=0, strict=True)]


class RuntimeCpuFit(_Strict):
    """The runtime CPU model's coefficients (``calibration/runtime_cpu.py``), written by
    ``python -m bench.runtime_calibration --write``: per role, one coefficient >= 0 per
    term of ``terms`` (``messages`` in ms per message end)."""

    terms: tuple[str, ...] = RUNTIME_CPU_TERMS
    worker: tuple[_Coef, _Coef, _Coef, _Coef]
    ps: tuple[_Coef, _Coef, _Coef, _Coef]
    allreduce: tuple[_Coef, _Coef, _Coef, _Coef] | None = Field(
        default=None, description="a worker of an all-reduce job; absent: the worker's coefficients")
    note: str = ""

    @field_validator("terms")
    @classmethod
    def _terms(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if tuple(v) != RUNTIME_CPU_TERMS:
            raise ValueError(f"must be {list(RUNTIME_CPU_TERMS)}")
        return v


class NetworkMeasurement(BaseModel):
    """Measured point-to-point / all-reduce figures (free-form beyond these keys)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    p2p_bw_Bps: float | None = None
    p2p_latency_s: float | None = None
    runtime_cpu: RuntimeCpuFit | None = Field(
        default=None, description="the runtime CPU model fitted on this machine (hetsim validate applies it)")


class Measurement(_Strict):
    """What a measured profile was fitted to: free-form records of ``hetsim profile``."""

    spread: dict[str, Any] | None = Field(default=None, description="spread of the repeats "
                                          "(calibration.calibrate.spread_of)")
    raw: dict[str, Any] | None = Field(default=None, description="raw measurements, the "
                                       "calibration's input")


#: the largest rate (FLOP/s, bytes/s) and memory a profile may give: far above any device
#: (an ideal link is written 1e20); rates are at least 1, so that the times computed from
#: them stay finite
MAX_RATE = 1e24


class DeviceProfile(_Strict):
    """One device type (schema 2). Units are in the field names; time in seconds.

    The cost model's roofline reads the peaks, the bandwidth, the launch overhead and
    the efficiency tables (``efficiency``, ``efficiency_bwd``, ``mem_efficiency``,
    ``mem_efficiency_bwd``); ``corrections`` lists what it adds to or changes in the
    roofline for this device (none for a datasheet profile); ``layers`` (measured
    per-layer tables) replaces both for the layers it holds.
    """

    schema_: Literal[2] = Field(2, alias="schema", description="format version")
    name: str = Field(min_length=1, description="type name used in configs, e.g. 'v100'")
    kind: Literal["cpu", "gpu", "accel"]
    peak_flops: dict[str, float] = Field(description="peak FLOP/s per math mode (fp32, tf32, fp16, "
                                         "bf16, int8; dense, without sparsity); fp32 required")
    math_fallback: dict[str, str] | None = Field(
        default=None, description="for a precision without a peak here, the math mode this "
        "device runs its matmuls in instead, e.g. {\"tf32\": \"fp32\"} for a GPU without TF32 "
        "(missing: such a precision is an error on this device)")
    math_efficiency: dict[str, dict[str, Efficiency]] | None = Field(
        default=None, description="per math mode other than fp32 (tensor-core modes), the "
        "fraction of that mode's peak per op class, as efficiency (which stays the fp32 "
        "table and the fallback for an op class a mode's table lacks); when given, one "
        "table for every such mode in peak_flops")
    mem_bw_Bps: float = Field(gt=0, le=MAX_RATE, description="memory bandwidth, bytes/s")
    memory_bytes: float = Field(gt=0, le=MAX_RATE, description="device memory, bytes")
    launch_overhead_s: float = Field(ge=0, le=1.0, description="fixed cost of one kernel launch")
    efficiency: dict[str, Efficiency] = Field(
        default_factory=dict, description="fraction of peak per op class (missing: 1.0)"
    )
    nic_bw_Bps: float = Field(gt=0, le=MAX_RATE, description="network interface bandwidth, bytes/s")
    price_per_hour: float = Field(ge=0, description="USD per hour, on demand")
    power_w: Power
    source: Source
    layers: dict[str, LayerTable] | None = Field(
        default=None, description="measured per-layer tables keyed by sim.costmodel.table_key"
    )
    efficiency_bwd: dict[str, Efficiency] | None = Field(
        default=None, description="backward-pass efficiency per op class (missing: `efficiency`)"
    )
    mem_efficiency: dict[str, Annotated[float, Field(gt=0, le=100)] | BandwidthCurve] | None = Field(
        default=None, description="fraction of mem_bw_Bps per op class, forward (missing: 1.0)"
    )
    mem_efficiency_bwd: dict[str, Annotated[float, Field(gt=0, le=100)] | BandwidthCurve] | None = Field(
        default=None, description="fraction of mem_bw_Bps per op class, backward (missing: forward's)"
    )
    corrections: Corrections = Field(
        default_factory=Corrections, description="the cost model's corrections to the roofline, "
        "{name: parameters} (missing: none; hardware_profiles.corrections)")
    quant: dict[str, QuantCost] | None = Field(
        default=None, description="measured (de)quantization cost per bit width ('2', '4', '8', '16'); "
        "missing: one memory pass over the fp32 and packed bytes")
    network: NetworkMeasurement | None = None
    measurement: Measurement = Field(
        default_factory=Measurement, description="spread and raw measurements (measured only)")

    @model_validator(mode="before")
    @classmethod
    def _schema_1(cls, data: Any) -> Any:
        """Schema 1 data (``"schema": 1``, or no ``schema``, 1's default, and a field only
        schema 1 has) is migrated to schema 2 before it is validated
        (:func:`hardware_profiles.migrate.migrate_v1`)."""
        if isinstance(data, dict) and (data.get("schema") == 1 or (
                "schema" not in data and any(k in data for k in V1_FIELDS))):
            return migrate_v1(data)
        return data

    @field_validator("mem_bw_Bps", "nic_bw_Bps")
    @classmethod
    def _rate(cls, v: float) -> float:
        if v < 1:
            raise ValueError(f"must be at least 1 byte/s (got {v})")
        return v

    @field_validator("peak_flops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if "fp32" not in v:
            raise ValueError("must contain 'fp32'")
        _known_keys(v, DTYPES, "dtype")
        for k, x in v.items():
            if not 1 <= x <= MAX_RATE:
                raise ValueError(f"{k} must be at least 1 and at most {MAX_RATE:g}")
        return v

    @model_validator(mode="after")
    def _math_modes(self) -> DeviceProfile:
        for k, to in (self.math_fallback or {}).items():
            if k not in DTYPES or k == "fp32":
                raise ValueError(f"math_fallback.{k}: not a precision with a fallback "
                                 f"(known: {', '.join(d for d in DTYPES if d != 'fp32')})")
            if k in self.peak_flops:
                raise ValueError(f"math_fallback.{k}: peak_flops has {k}; a fallback is for a "
                                 "mode the device lacks")
            if to not in self.peak_flops:
                raise ValueError(f"math_fallback.{k}: {to!r} is not a peak_flops entry")
        if self.math_efficiency is not None:
            for k, table in self.math_efficiency.items():
                if k not in MATH_MODES:
                    raise ValueError(f"math_efficiency.{k}: not a math mode with its own table "
                                     f"(known: {', '.join(MATH_MODES)})")
                if k not in self.peak_flops:
                    raise ValueError(f"math_efficiency.{k}: peak_flops has no {k}")
                for op in table:
                    if op not in OP_CLASSES and not _EFF_KEY_RE.match(op):
                        raise ValueError(f"math_efficiency.{k}.{op}: unknown op class "
                                         f"(known: {', '.join(OP_CLASSES)}, or OP/KIND)")
            missing = [m for m in MATH_MODES if m in self.peak_flops and m != "int8"
                       and m not in self.math_efficiency]
            if missing:
                raise ValueError(f"math_efficiency.{missing[0]}: incomplete: peak_flops has "
                                 f"{missing[0]} but math_efficiency has no table for it")
        return self

    @field_validator("quant")
    @classmethod
    def _quant_bits(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return _known_keys(v, QUANT_BITS, "bit width")

    def quant_s_per_value(self, bits: int, side: str) -> float | None:
        """Measured seconds per value to pack (``side='pack'``) or unpack at ``bits``, or None."""
        q = (self.quant or {}).get(str(bits))
        if q is None:
            return None
        return q.pack_s_per_value if side == "pack" else q.unpack_s_per_value

    @field_validator("mem_efficiency", "mem_efficiency_bwd")
    @classmethod
    def _mem_eff(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_kind_keys(v)

    @field_validator("efficiency", "efficiency_bwd")
    @classmethod
    def _eff(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for k in v or {}:
            if k not in OP_CLASSES and not _EFF_KEY_RE.match(k):
                raise ValueError(f"unknown op class {k!r} (known: {', '.join(OP_CLASSES)}, "
                                 "or OP/KIND)")
        return v

    def peak(self, mode: str) -> float:
        """Peak FLOP/s of math mode ``mode`` (a ``peak_flops`` key; which mode a job's
        precision runs in on this device is :func:`sim.precision.math_mode`'s answer).

        Raises:
            KeyError: the profile has no peak for ``mode``.
        """
        return self.peak_flops[mode]

    def eff(self, op: str, flops: float, phase: str = "fwd", nbytes: float | None = None,
            kind: str | None = None, mode: str = "fp32") -> float:
        """Fraction of ``mode``'s peak for one call of ``flops`` FLOPs of op class ``op``.

        In math mode ``mode`` other than fp32, ``math_efficiency[mode]`` where it has
        the op class (or its ``OP/KIND``). Otherwise the backward pass
        (``phase='bwd'``) uses ``efficiency_bwd`` where it has the op class, else
        ``efficiency``. Within a table the entry ``OP/KIND`` (e.g. ``conv/spatial``,
        see :func:`sim.costmodel.compute_kind`) is used where present, else the op
        class's. An intensity curve reads ``flops / nbytes`` (its last value when
        ``nbytes`` is not given).
        """
        found = self._eff_entry(op, phase, kind, mode)
        if found is None:
            return 1.0
        e = found[1]
        if isinstance(e, EfficiencyCurve):
            return e.at(flops)
        if isinstance(e, IntensityCurve):
            return e.at(flops / nbytes) if nbytes else e.eff[-1]
        return float(e)

    def eff_key(self, op: str, phase: str = "fwd", kind: str | None = None,
                mode: str = "fp32") -> str | None:
        """The key of the entry :meth:`eff` prices such a pass with (``OP/KIND`` or
        the op class), None where it finds none (and returns 1.0)."""
        found = self._eff_entry(op, phase, kind, mode)
        return found[0] if found is not None else None

    def _eff_entry(self, op: str, phase: str, kind: str | None, mode: str = "fp32"
                   ) -> tuple[str, Efficiency] | None:
        keys = [f"{op}/{kind}", op] if kind else [op]
        by_mode = (self.math_efficiency or {}).get(mode) if mode != "fp32" else None
        for table in ((by_mode, self.efficiency_bwd, self.efficiency) if phase == "bwd"
                      else (by_mode, self.efficiency)):
            for k in keys:
                if table and k in table:
                    return k, table[k]
        return None

    def mem_eff(self, op: str, nbytes: float, phase: str = "fwd", kernels: int | None = None,
                has_params: bool = False, reduces: bool = False, inplace: bool = False) -> float:
        """Fraction of ``mem_bw_Bps`` for one call of op class ``op`` moving ``nbytes``.

        1.0 unless the profile has ``mem_efficiency`` (``mem_efficiency_bwd`` for
        the backward pass, falling back to the forward entries). Within a table
        the entry of the layer's kind, :func:`mem_key` (op class, forward kernel
        count, parameters or not, output smaller than input or not, in place or
        not: a ReLU, a BatchNorm, a Dropout and a max-pool are all ``elementwise``
        but make different passes over their data), is used where present, else
        the op class's.
        """
        keys = [op] if kernels is None else [mem_key(op, kernels, has_params, reduces, inplace), op]
        e = None
        for table in ((self.mem_efficiency_bwd, self.mem_efficiency) if phase == "bwd"
                      else (self.mem_efficiency,)):
            for k in keys:
                if table and k in table:
                    e = table[k]
                    break
            if e is not None:
                break
        if e is None:
            return 1.0
        if isinstance(e, BandwidthCurve):
            return e.at(nbytes)
        return float(e)
