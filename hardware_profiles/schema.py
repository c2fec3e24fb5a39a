"""Device profile format (schema 1): what a device type can do and what it costs.

A profile is a JSON file, ``hardware_profiles/NAME.json`` or in a folder named
by a config's ``profiles:``. Datasheet profiles carry vendor figures; measured
profiles (``hetsim profile``) add per-layer tables and network measurements.
"""

from __future__ import annotations

import math
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

OP_CLASSES = ("gemm", "conv", "embedding", "elementwise", "attention")
DTYPES = ("fp32", "fp16", "bf16", "int8")


class _Strict(BaseModel):
    # allow_inf_nan=False: Python's json module accepts NaN and Infinity, and an
    # infinite bandwidth or peak would silently make every cost zero.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _check_curve(xs: list[float], ys: list[float], x_name: str, y_max: float,
                 y_name: str = "eff", zero: bool = False) -> None:
    """A curve's points: non-empty, equal lengths, x positive and strictly increasing,
    every value in (0, y_max] (``zero``: in [0, y_max])."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"{x_name} and {y_name} must be non-empty lists of equal length")
    if any(f <= 0 for f in xs) or any(b <= a for a, b in pairwise(xs)):
        raise ValueError(f"{x_name} must be positive and strictly increasing")
    if any(not (0 <= e if zero else 0 < e) or e > y_max for e in ys):
        raise ValueError(f"{y_name} values must lie in {'[' if zero else '('}0, {y_max:g}]")


def _known_keys(v: dict[str, Any] | None, known: Sequence[str], what: str) -> dict[str, Any] | None:
    """``v`` unchanged if every key is one of ``known``; else a ValueError naming the
    first unknown ``what`` and the known ones."""
    for k in v or {}:
        if k not in known:
            raise ValueError(f"unknown {what} {k!r} (known: {', '.join(known)})")
    return v


def _log_interp(xs_: list[float], ys: list[float], x_: float) -> float:
    """Piecewise linear in log10(x) through the points, clamped at both ends."""
    if x_ <= xs_[0]:
        return ys[0]
    if x_ >= xs_[-1]:
        return ys[-1]
    x = math.log10(x_)
    xs = [math.log10(f) for f in xs_]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]  # pragma: no cover (guarded above)


class _Curve(_Strict):
    """Points (x, eff), piecewise linear in log10(x), clamped at both ends; a subclass
    names its x field (``_x``, the file format's key) and the largest allowed value."""

    _x: ClassVar[str]
    _max: ClassVar[float]
    eff: list[float]

    @model_validator(mode="after")
    def _check(self) -> _Curve:
        _check_curve(getattr(self, self._x), self.eff, self._x, self._max)
        return self

    def at(self, x: float) -> float:
        """The curve's value at ``x`` (FLOPs, bytes or intensity of one call)."""
        return _log_interp(getattr(self, self._x), self.eff, x)


class EfficiencyCurve(_Curve):
    """Achieved fraction of peak FLOP/s as a function of the work of one call."""

    _x: ClassVar[str] = "flops"
    _max: ClassVar[float] = 1.5
    flops: list[float] = Field(description="FLOPs of one call (one layer on one batch), increasing")
    eff: list[float] = Field(description="fraction of peak at each point, in (0, 1.5]")


class BandwidthCurve(_Curve):
    """Achieved fraction of ``mem_bw_Bps`` as a function of the bytes one call moves.

    Values above 1 are allowed: small working sets run from cache, faster than
    the DRAM bandwidth that ``mem_bw_Bps`` states.
    """

    _x: ClassVar[str] = "bytes"
    _max: ClassVar[float] = 100
    bytes: list[float] = Field(description="bytes moved by one call, increasing")
    eff: list[float] = Field(description="fraction of mem_bw_Bps at each point, in (0, 100]")


_EFF_KEY_RE = re.compile(r"^(" + "|".join(OP_CLASSES) + r")/[a-z0-9]+$")
_MEM_KEY_RE = re.compile(r"^(" + "|".join(OP_CLASSES) + r")/k\d+p?r?i?$")


def mem_key(op: str, kernels: int, has_params: bool, reduces: bool = False, inplace: bool = False) -> str:
    """Key of a layer kind in ``mem_efficiency``: ``OP/kN`` plus ``p`` when the
    layer has parameters, ``r`` when its output is smaller than its input
    (pooling) and ``i`` when it works in place, e.g. ``elementwise/k2p`` (two
    kernels, parameters: a BatchNorm), ``elementwise/k1i`` (``ReLU(inplace=True)``)."""
    return f"{op}/k{kernels}{'p' if has_params else ''}{'r' if reduces else ''}{'i' if inplace else ''}"


def _per_kind(table: dict[str, float] | None, op: str, kernels: int | None, has_params: bool,
              reduces: bool, inplace: bool = False) -> float:
    """``table``'s entry of the layer's kind (:func:`mem_key`), else its op class's, else 0."""
    if not table:
        return 0.0
    for k in [op] if kernels is None else [mem_key(op, kernels, has_params, reduces, inplace), op]:
        if k in table:
            return float(table[k])
    return 0.0


class IntensityCurve(_Curve):
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


class ColdCurve(_Strict):
    """Extra seconds a call pays right after passes that moved ``bytes``: the cold-call
    benchmark of ``hetsim profile`` (a small call timed right after a copy, less the
    same call timed again at once). Piecewise linear in log10(bytes), clamped at both
    ends: below its first point (the benchmark's smallest size, 0.25 MiB, which the
    caches hold) a pass pays that point's seconds (0.0-0.5 us on the AMD EPYC)."""

    bytes: list[float] = Field(description="bytes the passes before the call moved, increasing")
    s: list[float] = Field(description="extra seconds of the call at each point, in [0, 0.01]")

    @model_validator(mode="after")
    def _check(self) -> ColdCurve:
        _check_curve(self.bytes, self.s, "bytes", 0.01, y_name="s", zero=True)
        return self

    def at(self, nbytes: float) -> float:
        """Extra seconds after passes that moved ``nbytes``."""
        return _log_interp(self.bytes, self.s, nbytes)


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
    """Provenance of the figures: datasheet or measured (device, torch version, date)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["datasheet", "measured"]
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
    call_overhead_s: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = Field(
        default=None, description="fixed seconds per call, forward, added to a layer's time: a "
        "memory-bound layer's kind's entry (else its op class's), a compute layer's op class's "
        "(missing: 0); keys as mem_efficiency's")
    call_overhead_bwd_s: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = Field(
        default=None, description="fixed seconds per call, backward, as call_overhead_s "
        "(missing: 0; no fallback to the forward's); keys as mem_efficiency's")
    row_cost_s: dict[str, Annotated[float, Field(ge=0, le=1e-3)]] | None = Field(
        default=None, description="seconds per row a sparse (embedding) layer looks up (batch x "
        "rows_per_sample), forward, added to its time (missing: 0); keys as mem_efficiency's")
    row_cost_bwd_s: dict[str, Annotated[float, Field(ge=0, le=1e-3)]] | None = Field(
        default=None, description="seconds per row a sparse layer looks up, backward (missing: 0; "
        "no fallback to the forward's); keys as mem_efficiency's")
    layer_glue_s: dict[Literal["fwd", "bwd"], tuple[Annotated[float, Field(ge=0, le=1)],
                                                      Annotated[float, Field(ge=0, le=1)]]] | None = Field(
        default=None, description="glue charged to each layer priced by the curves, per pass "
        "('fwd', 'bwd'): [seconds per layer, seconds per byte of the layer's output]: the work of "
        "no layer (module calls, residual adds, concatenations, gradient accumulation, the loss) "
        "that falls between layers and that the curves, fitted to the layers' own times, leave "
        "out (missing: none)")
    cold_call_s: dict[str, ColdCurve] | None = Field(
        default=None, description="per op class: extra seconds of a layer's pass priced by the "
        "curves after the passes before it (the profile's cold_window of them, in execution order) "
        "moved that many bytes: caches they flushed (missing: 0)")
    cold_window: int | None = Field(
        default=None, ge=1, le=8, description="how many passes before a pass count for "
        "cold_call_s (hetsim calibrate chooses it among 1, 2, 3, 5 and 8; missing with "
        "cold_call_s: 1)")
    dense_sparse_grad: bool = Field(
        default=False, description="the backward of a sparse (embedding) layer writes a dense "
        "gradient of its whole table (torch's nn.Embedding default): adds param_bytes to its bytes")
    weight_grad_only_bwd: bool = Field(
        default=False, description="the backward of a GEMM or convolution that computes no input "
        "gradient (its input needs none: a model's first layer; backward FLOPs equal to its "
        "forward FLOPs, see sim.costmodel.computes_input_grad) moves param_bytes + batch * "
        "(input + output bytes): it writes the weight gradient and reads its input and the output "
        "gradient, but reads no weights and writes no input gradient (missing: priced with the "
        "bytes of a layer computing both gradients)")
    quant: dict[str, QuantCost] | None = Field(
        default=None, description="measured (de)quantization cost per bit width ('2', '4', '8', '16'); "
        "missing: one memory pass over the fp32 and packed bytes")
    network: NetworkMeasurement | None = None
    spread: dict[str, Any] | None = Field(default=None, description="measurement spread (measured only)")
    raw: dict[str, Any] | None = Field(default=None, description="raw measurements (measured only)")

    @field_validator("peak_flops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if "fp32" not in v:
            raise ValueError("must contain 'fp32'")
        _known_keys(v, DTYPES, "dtype")
        for k, x in v.items():
            if not x > 0:
                raise ValueError(f"{k} must be > 0")
        return v

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

    @field_validator("mem_efficiency", "mem_efficiency_bwd", "call_overhead_s", "call_overhead_bwd_s",
                     "row_cost_s", "row_cost_bwd_s")
    @classmethod
    def _mem_eff(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for k in v or {}:
            if k not in OP_CLASSES and not _MEM_KEY_RE.match(k):
                raise ValueError(f"unknown key {k!r}: an op class ({', '.join(OP_CLASSES)}) "
                                 "or OP/kN[p][r][i] (N kernels, p: parameters, r: reducing, i: in place)")
        return v

    @field_validator("cold_call_s")
    @classmethod
    def _cold_ops(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return _known_keys(v, OP_CLASSES, "op class")

    @field_validator("efficiency", "efficiency_bwd")
    @classmethod
    def _eff(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for k in v or {}:
            if k not in OP_CLASSES and not _EFF_KEY_RE.match(k):
                raise ValueError(f"unknown op class {k!r} (known: {', '.join(OP_CLASSES)}, "
                                 "or OP/KIND)")
        return v

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; bf16 and fp16 stand in for each other, else fp32."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        alt = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
        if alt and alt in self.peak_flops:
            return self.peak_flops[alt]
        return self.peak_flops["fp32"]

    def eff(self, op: str, flops: float, phase: str = "fwd", nbytes: float | None = None,
            kind: str | None = None) -> float:
        """Fraction of peak for one call of ``flops`` FLOPs of op class ``op``.

        The backward pass (``phase='bwd'``) uses ``efficiency_bwd`` where it has
        the op class, else ``efficiency``. Within a table the entry ``OP/KIND``
        (e.g. ``conv/spatial``, see :func:`sim.costmodel.compute_kind`) is used
        where present, else the op class's. An intensity curve reads ``flops /
        nbytes`` (its last value when ``nbytes`` is not given).
        """
        found = self._eff_entry(op, phase, kind)
        if found is None:
            return 1.0
        e = found[1]
        if isinstance(e, EfficiencyCurve):
            return e.at(flops)
        if isinstance(e, IntensityCurve):
            return e.at(flops / nbytes) if nbytes else e.eff[-1]
        return float(e)

    def eff_key(self, op: str, phase: str = "fwd", kind: str | None = None) -> str | None:
        """The key of the entry :meth:`eff` prices such a pass with (``OP/KIND`` or
        the op class), None where it finds none (and returns 1.0)."""
        found = self._eff_entry(op, phase, kind)
        return found[0] if found is not None else None

    def _eff_entry(self, op: str, phase: str, kind: str | None
                   ) -> tuple[str, Efficiency] | None:
        keys = [f"{op}/{kind}", op] if kind else [op]
        for table in ((self.efficiency_bwd, self.efficiency) if phase == "bwd"
                      else (self.efficiency,)):
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

    def glue(self, phase: str, out_bytes: float) -> float:
        """Glue seconds charged to one ``phase`` pass of a layer whose output is ``out_bytes``:
        ``a + c * out_bytes`` from ``layer_glue_s[phase] = [a, c]``; 0 when missing."""
        g = (self.layer_glue_s or {}).get(phase)  # type: ignore[call-overload]
        return 0.0 if g is None else float(g[0] + g[1] * out_bytes)

    def call_overhead(self, op: str, phase: str = "fwd", kernels: int | None = None,
                      has_params: bool = False, reduces: bool = False, inplace: bool = False) -> float:
        """Fixed seconds of one call of a layer, beyond ``launch_overhead_s`` per kernel.

        From ``call_overhead_s`` (forward) or ``call_overhead_bwd_s`` (backward; no
        fallback between the two): the entry of the layer's kind (:func:`mem_key`)
        where present, else the op class's, else 0; with ``kernels=None`` the op
        class's only (how the cost model asks for a layer with FLOPs). ``hetsim
        calibrate`` fits one per bandwidth curve it fits (the per-call cost of
        framework dispatch that a curve over bytes cannot take on: it would flatten
        below its first knot) and one per compute op class (a small layer's call
        costs about the same whatever its FLOPs, which a curve over intensity would
        read as a low efficiency).
        """
        return _per_kind(self.call_overhead_bwd_s if phase == "bwd" else self.call_overhead_s,
                         op, kernels, has_params, reduces, inplace)

    def cold_s(self, op: str, streamed_bytes: float) -> float:
        """Extra seconds of a pass of op class ``op`` after passes that moved
        ``streamed_bytes`` (``cold_call_s``; 0 where the profile has none for ``op``)."""
        curve = (self.cold_call_s or {}).get(op)
        return 0.0 if curve is None or streamed_bytes <= 0 else curve.at(streamed_bytes)

    def row_cost(self, op: str, phase: str = "fwd", kernels: int | None = None,
                 has_params: bool = False, reduces: bool = False, inplace: bool = False) -> float:
        """Seconds per row a sparse layer looks up, beyond its bytes and call overhead.

        From ``row_cost_s`` (forward) or ``row_cost_bwd_s`` (backward; no fallback
        between the two), keyed as :meth:`call_overhead`; 0 where missing. ``hetsim
        calibrate`` fits one per bandwidth curve of lookups: a lookup's cost is per row
        (an index to read, sort or scatter-add) more than per byte, which a curve over
        bytes cannot tell from the bytes of the table itself.
        """
        return _per_kind(self.row_cost_bwd_s if phase == "bwd" else self.row_cost_s,
                         op, kernels, has_params, reduces, inplace)
