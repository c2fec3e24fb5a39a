"""The cost model's corrections as a profile states them (schema 2).

A profile's ``corrections`` subsection, ``{name: parameters}``, lists the terms the
cost model adds to (or changes in) its roofline for this device; a correction that
is not listed is not applied, so a datasheet profile, which lists none, is priced by
the roofline alone. This module holds the **data**: one parameters model per
correction, field names and ranges as the file states them. The **formulas** are in
``sim/corrections/`` (one module per correction, named as here); ``hetsim calibrate``
fits and writes the parameters (see ``docs/modelling/cost_model.md``).

Keys of a per-kind table (``call_overhead``, ``row_cost``) are an op class or a layer
kind ``OP/kN[p][r][i]`` (:func:`hardware_profiles.base.mem_key`), as ``mem_efficiency``'s.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from hardware_profiles.base import OP_CLASSES, _Curve, _known_keys, _Strict, check_kind_keys

_Seconds = Annotated[float, Field(ge=0, le=1)]
_PerRow = Annotated[float, Field(ge=0, le=1e-3)]


class _KindTables(_Strict):
    """Per phase (``fwd``, ``bwd``), a table keyed by layer kind or op class (a missing
    phase: 0, with no fallback between the two)."""

    @field_validator("fwd", "bwd", check_fields=False)
    @classmethod
    def _keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_kind_keys(v)


class CallOverheadParams(_KindTables):
    """``call_overhead``: fixed seconds of one call of a layer beyond ``launch_overhead_s``
    per kernel, per phase and layer kind or op class."""

    fwd: dict[str, _Seconds] | None = Field(default=None, description="forward: seconds per call")
    bwd: dict[str, _Seconds] | None = Field(default=None, description="backward: seconds per call")


class RowCostParams(_KindTables):
    """``row_cost``: seconds per row a sparse (embedding) layer looks up, per phase and
    layer kind or op class."""

    fwd: dict[str, _PerRow] | None = Field(default=None, description="forward: seconds per row looked up")
    bwd: dict[str, _PerRow] | None = Field(default=None, description="backward: seconds per row looked up")


class GlueParams(_Strict):
    """``glue``: per phase ``[a, c]``: seconds per layer pass and seconds per byte of the
    layer's output (a missing phase: none)."""

    fwd: tuple[_Seconds, _Seconds] | None = Field(default=None, description="forward: [a, c]")
    bwd: tuple[_Seconds, _Seconds] | None = Field(default=None, description="backward: [a, c]")


class ColdCurve(_Curve):
    """Extra seconds a call pays right after passes that moved ``bytes``: the cold-call
    benchmark of ``hetsim profile`` (a small call timed right after a copy, less the
    same call timed again at once). Piecewise linear in log10(bytes), clamped at both
    ends: below its first point (the benchmark's smallest size, which the caches
    hold) a pass pays that point's seconds. ``at(nbytes)``: the extra seconds after
    passes that moved ``nbytes``."""

    _x: ClassVar[str] = "bytes"
    _y: ClassVar[str] = "s"
    _max: ClassVar[float] = 0.01
    _zero: ClassVar[bool] = True
    bytes: list[float] = Field(description="bytes the passes before the call moved, increasing")
    s: list[float] = Field(description="extra seconds of the call at each point, in [0, 0.01]")


class ColdCallsParams(_Strict):
    """``cold_calls``: per op class, the extra seconds of a pass after the ``window``
    passes before it (in execution order) moved that many bytes."""

    window: int = Field(default=1, ge=1, le=8, description="how many passes before a pass count")
    curves: dict[str, ColdCurve] = Field(description="per op class: extra seconds over bytes moved")

    @field_validator("curves")
    @classmethod
    def _ops(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _known_keys(v, OP_CLASSES, "op class") or v


class SkinnyGemmParams(_Strict):
    """``skinny_gemm``: no parameters; listed, a GEMM of few rows priced by its own
    ``gemm/rowsM`` efficiency curve is priced by compute alone."""


class DenseSparseGradParams(_Strict):
    """``dense_sparse_grad``: no parameters; listed, the backward of a sparse layer also
    writes a dense gradient of its whole table."""


class WeightGradOnlyBwdParams(_Strict):
    """``weight_grad_only_bwd``: no parameters; listed, the backward of a GEMM or
    convolution that computes no input gradient moves only the bytes it needs."""


class WaveQuantizationParams(_Strict):
    """``wave_quantization``: a GPU runs a GEMM or convolution as output tiles of
    ``tile_m x tile_n``, ``sms`` of them at a time (one per streaming multiprocessor)."""

    sms: int = Field(gt=0, le=100_000, description="streaming multiprocessors (datasheet)")
    tile_m: int = Field(128, gt=0, le=4096, description="rows of one output tile")
    tile_n: int = Field(128, gt=0, le=4096, description="columns of one output tile")


_MODES = ("fp32", "tf32", "fp16", "bf16", "int8")


class LayoutTransposeParams(_Strict):
    """``layout_transpose``: memory passes over a convolution's activations that
    contiguous (NCHW) layout costs in the math modes whose kernels want channels-last."""

    passes: float = Field(ge=0, le=100, description="passes over the input and output bytes")
    modes: tuple[str, ...] = Field(("fp16", "bf16"), description="math modes that pay them")

    @field_validator("modes")
    @classmethod
    def _modes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            if m not in _MODES:
                raise ValueError(f"unknown math mode {m!r} (known: {', '.join(_MODES)})")
        return v


class Corrections(_Strict):
    """A profile's ``corrections``: each correction listed with its parameters (an
    absent one is not applied). Formulas: ``sim/corrections/<name>.py``."""

    call_overhead: CallOverheadParams | None = None
    row_cost: RowCostParams | None = None
    glue: GlueParams | None = None
    cold_calls: ColdCallsParams | None = None
    skinny_gemm: SkinnyGemmParams | None = None
    dense_sparse_grad: DenseSparseGradParams | None = None
    weight_grad_only_bwd: WeightGradOnlyBwdParams | None = None
    wave_quantization: WaveQuantizationParams | None = None
    layout_transpose: LayoutTransposeParams | None = None
