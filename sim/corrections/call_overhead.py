"""``call_overhead``: fixed seconds of one call of a layer beyond its kernel launches.

    extra_s = table[phase][first of (layer kind, op class)]   a pass without FLOPs
            = table[phase][op class]                           a layer's call with FLOPs
            = 0                                                a bare kernel with FLOPs,
                                                               or no entry

Reads ``corrections.call_overhead``: ``{"fwd": {key: s}, "bwd": {key: s}}``
(:class:`hardware_profiles.corrections.CallOverheadParams`; keys as ``mem_efficiency``'s;
a missing phase is 0, with no fallback between the phases). ``hetsim calibrate`` fits
one per bandwidth curve it fits (framework dispatch, which a curve over bytes, clamped
below its first knot, cannot take on) and one per compute op class (a small layer's
call costs about the same whatever its FLOPs, which a curve over intensity would read
as a low efficiency).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import CallOverheadParams
from sim.corrections.base import Correction, PassContext, of_phase, per_kind


@dataclass(frozen=True)
class CallOverhead(Correction):
    name: ClassVar[str] = "call_overhead"
    params: CallOverheadParams

    def extra_s(self, ctx: PassContext) -> float:
        table = of_phase(self.params.fwd, self.params.bwd, ctx.phase)
        if ctx.flops == 0:
            return per_kind(table, ctx.kind_keys)
        return per_kind(table, (ctx.op,)) if ctx.call else 0.0
