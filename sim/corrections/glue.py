"""``glue``: work of no layer charged to each layer pass.

    extra_s = a[phase] + c[phase] * out_bytes      (0 for a phase without [a, c])

``out_bytes``: the bytes of the layer's output on the batch (``batch * act_scale *
activation_bytes``). Glue is what falls between layers (module calls, residual adds,
concatenations, gradient accumulation, the loss), which the profiler charges to a
neighbouring layer and which the roofline's curves, fitted to the layers' own times,
leave out. Not charged to a layer priced by a measured table (which holds its glue),
nor to a measured point (a layer's own time). Reads ``corrections.glue``: ``{"fwd": [a,
c], "bwd": [a, c]}`` (:class:`hardware_profiles.corrections.GlueParams`). ``hetsim
calibrate`` fits it where the raw runs record the layers' own times
(``calibration.calibrate.fit_glue``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import GlueParams
from sim.corrections.base import Correction, PassContext, of_phase


@dataclass(frozen=True)
class Glue(Correction):
    name: ClassVar[str] = "glue"
    params: GlueParams

    def extra_s(self, ctx: PassContext) -> float:
        a_c = of_phase(self.params.fwd, self.params.bwd, ctx.phase)
        return 0.0 if a_c is None else float(a_c[0] + a_c[1] * ctx.out_bytes)
