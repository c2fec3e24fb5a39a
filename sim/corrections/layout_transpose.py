"""``layout_transpose``: a convolution in contiguous (NCHW) layout on tensor cores.

    extra_s = passes * activation_bytes / (nbytes / memory_s)
              for a convolution whose math mode is in ``modes``, in ``contiguous`` layout

``activation_bytes`` = ``batch * (in_scale * input_bytes + act_scale *
activation_bytes)``, the pass's input and output; ``nbytes / memory_s`` is the
bandwidth the roofline gives the pass. Tensor-core convolution kernels take
channels-last (NHWC) operands; on activations in torch's default contiguous (NCHW)
layout the library transposes them in and out, memory passes the same convolution in
``channels_last`` (``job.memory_format``) does not make. Reads
``corrections.layout_transpose``: ``{"passes": P, "modes": ["fp16", "bf16"]}``
(:class:`hardware_profiles.corrections.LayoutTransposeParams`); ``passes`` is fitted to
published measurements (``calibration.published``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import LayoutTransposeParams
from sim.corrections.base import Correction, PassContext


@dataclass(frozen=True)
class LayoutTranspose(Correction):
    name: ClassVar[str] = "layout_transpose"
    params: LayoutTransposeParams

    def extra_s(self, ctx: PassContext) -> float:
        if (ctx.op != "conv" or ctx.memory_format != "contiguous" or ctx.mode not in self.params.modes
                or ctx.layer is None or ctx.memory_s <= 0 or ctx.nbytes <= 0):
            return 0.0
        moved = ctx.batch * (ctx.in_scale * ctx.input_bytes + ctx.act_scale * ctx.layer.activation_bytes)
        return self.params.passes * moved * ctx.memory_s / ctx.nbytes
