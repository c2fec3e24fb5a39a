"""``row_cost``: seconds per row a sparse (embedding) layer looks up.

    extra_s = table[phase][first of (layer kind, op class)] * rows   a pass without FLOPs
            = 0                                                      otherwise, or no entry

``rows``: the rows of the table the batch looks up, repeats included (``batch *
rows_per_sample``; 0 for a dense layer). Reads ``corrections.row_cost``: ``{"fwd":
{key: s}, "bwd": {key: s}}`` (:class:`hardware_profiles.corrections.RowCostParams`; keys
as ``mem_efficiency``'s; a missing phase is 0, with no fallback between the phases).
``hetsim calibrate`` fits one per bandwidth curve of lookups, with the call overhead: a
lookup costs per row (an index to read, sort or scatter-add) more than per byte, which
a curve over bytes cannot tell from the bytes of the table itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import RowCostParams
from sim.corrections.base import Correction, PassContext, of_phase, per_kind


@dataclass(frozen=True)
class RowCost(Correction):
    name: ClassVar[str] = "row_cost"
    params: RowCostParams

    def extra_s(self, ctx: PassContext) -> float:
        if ctx.flops != 0:
            return 0.0
        return per_kind(of_phase(self.params.fwd, self.params.bwd, ctx.phase), ctx.kind_keys) * ctx.rows
