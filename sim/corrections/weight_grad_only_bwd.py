"""``weight_grad_only_bwd``: the backward of a GEMM or convolution that computes no
input gradient moves only what the weight gradient needs.

    nbytes = weight_bytes + batch * (in_scale * input_bytes + act_scale * activation_bytes)
                                   the backward of a layer with computes_input_grad False
    (plain: 2 * weight_bytes + batch * (in_scale * input_bytes + 2 * act_scale * activation_bytes))

It reads its input and the output gradient and writes the weight gradient, but reads
no weights and writes no input gradient: that is, ``extra = roofline(corrected bytes) -
roofline(plain bytes)`` (applied as a change of the pass's bytes, replacing them, see
:mod:`sim.corrections.base`). Without it such a layer is priced with the bytes of one
computing both gradients, which halves its intensity. Reads
``corrections.weight_grad_only_bwd``: ``{}`` (no parameters,
:class:`hardware_profiles.corrections.WeightGradOnlyBwdParams`). ``hetsim profile``
lists it; the calibration's points carry the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hardware_profiles.corrections import WeightGradOnlyBwdParams
from sim.corrections.base import Correction, PassContext, backward_layer
from sim.workload import Layer


def computes_input_grad(layer: Layer) -> bool:
    """Whether the backward of ``layer`` computes the gradient of its input.

    False for a GEMM or convolution with parameters whose backward FLOPs are
    below 1.5 times its forward FLOPs: its input needs no gradient (a model's
    first layer, fed by data), so its backward computes only the weight
    gradient, which costs as many FLOPs as the forward (the input gradient costs
    as many again: a layer computing both has twice its forward FLOPs). The
    record's FLOPs are counted from the backward's own ops
    (:func:`sim.torch_extract.from_torch`), so the ratio is exactly 1 or 2.
    True for every other layer.
    """
    return not (layer.op in ("gemm", "conv") and layer.param_bytes > 0 and layer.fwd_flops > 0
                and layer.bwd_flops < 1.5 * layer.fwd_flops)


@dataclass(frozen=True)
class WeightGradOnlyBwd(Correction):
    name: ClassVar[str] = "weight_grad_only_bwd"
    params: WeightGradOnlyBwdParams = field(default_factory=WeightGradOnlyBwdParams)

    def work(self, ctx: PassContext) -> PassContext:
        ly = backward_layer(ctx)
        if ly is None or computes_input_grad(ly):
            return ctx
        # write the weight gradient; read the input and the output gradient
        return ctx.replace(nbytes=ctx.weight_bytes + ctx.batch * (ctx.in_scale * ctx.input_bytes
                                                                   + ctx.act_scale * ly.activation_bytes))
