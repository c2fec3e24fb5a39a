"""``cold_calls``: extra seconds of a pass after passes that flushed the caches.

    extra_s = curves[op](streamed_bytes)     (0 without a curve for the op class, or
                                              when nothing was streamed)

``streamed_bytes``: what the ``window`` passes before this one moved, in an iteration's
execution order (forward of layers 0 .. n-1, then backward of n-1 .. 0, then the next
iteration; :func:`sim.costmodel.window_sums`), also where a plan splits the model into
stages on other devices. A curve is piecewise linear in log10(bytes), clamped at both
ends. Reads ``corrections.cold_calls``: ``{"window": w, "curves": {op: {"bytes": [...],
"s": [...]}}}`` (:class:`hardware_profiles.corrections.ColdCallsParams`). ``hetsim
calibrate`` makes the curves from the profiler's cold-call benchmark (``raw.cold``) and
keeps the window that prices the measured passes best, if it beats none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import ColdCallsParams
from sim.corrections.base import Correction, PassContext


@dataclass(frozen=True)
class ColdCalls(Correction):
    name: ClassVar[str] = "cold_calls"
    params: ColdCallsParams

    @property
    def streamed_window(self) -> int:
        return self.params.window

    def at(self, op: str, streamed_bytes: float) -> float:
        """Extra seconds of a pass of op class ``op`` after passes that moved ``streamed_bytes``."""
        curve = self.params.curves.get(op)
        return 0.0 if curve is None or streamed_bytes <= 0 else curve.at(streamed_bytes)

    def extra_s(self, ctx: PassContext) -> float:
        return self.at(ctx.op, ctx.streamed_bytes)
