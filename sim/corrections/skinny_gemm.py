"""``skinny_gemm``: a GEMM of few rows priced by its own curve alone.

    memory_s = 0      where the pass's efficiency entry (eff_key) is gemm/rowsM,
                      M <= SKINNY_ROWS: time = launches + flops / (peak * eff)

that is, ``extra = -(max(compute, memory) - compute)`` beside the roofline (applied as
a change of its memory term, see :mod:`sim.corrections.base`). A GEMM with parameters
whose call makes M <= :data:`SKINNY_ROWS` rows (batch x positions: a classifier's Linear
at batch 1-4) is a compute kind of its own, ``rowsM`` (:func:`rows_kind`, which
:func:`sim.costmodel.compute_kind` asks): such a call streams its weights once, and how
its time grows with its rows is the kernels' choice, not a rate, so each row count gets
a curve of its own where the profile measured enough calls of it. That curve over FLOPs
(which grow with the bytes) is already the call's streaming rate, from a weight matrix
in cache to one far past the caches, fitted by ``hetsim calibrate`` to all its passes;
a memory term beside it would price the same bytes twice. Without its kind's curve
such a call is priced as any GEMM. Reads ``corrections.skinny_gemm``: ``{}`` (no
parameters, :class:`hardware_profiles.corrections.SkinnyGemmParams`); ``hetsim
calibrate`` lists it where it fits a ``gemm/rowsM`` curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hardware_profiles.corrections import SkinnyGemmParams
from sim.corrections.base import Correction, PassContext

#: The most rows a GEMM with parameters may make on one call and still be a kind of its
#: own, ``gemm/rowsM`` (:func:`rows_kind`).
SKINNY_ROWS = 4

#: The compute kinds (``OP/KIND``) this correction prices by their own curve alone.
RATE_KINDS = frozenset(f"gemm/rows{m}" for m in range(1, SKINNY_ROWS + 1))


def rows_kind(rows: float) -> str | None:
    """The compute kind of a GEMM with parameters whose call makes ``rows`` rows (batch x
    positions, rounded): ``"rowsM"`` for M = 1 ... :data:`SKINNY_ROWS`, else None."""
    m = round(rows)
    return f"rows{m}" if 1 <= m <= SKINNY_ROWS else None


@dataclass(frozen=True)
class SkinnyGemm(Correction):
    name: ClassVar[str] = "skinny_gemm"
    params: SkinnyGemmParams = field(default_factory=SkinnyGemmParams)

    def terms(self, ctx: PassContext) -> PassContext:
        return ctx.replace(memory_s=0.0) if ctx.eff_key in RATE_KINDS else ctx
