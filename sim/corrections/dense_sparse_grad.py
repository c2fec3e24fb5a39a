"""``dense_sparse_grad``: the backward of a sparse layer writes a dense gradient of its
whole table (torch's ``nn.Embedding`` default).

    nbytes = plain bytes + param_bytes      the backward of a layer with a sparse table

that is, ``extra = roofline(corrected bytes) - roofline(plain bytes)`` (applied as a
change of the pass's bytes, see :mod:`sim.corrections.base`). Reads
``corrections.dense_sparse_grad``: ``{}`` (no parameters,
:class:`hardware_profiles.corrections.DenseSparseGradParams`). ``hetsim profile`` lists
it (the profiler's embeddings are ``nn.Embedding``); the calibration's points carry the
same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hardware_profiles.corrections import DenseSparseGradParams
from sim.corrections.base import Correction, PassContext, backward_layer


@dataclass(frozen=True)
class DenseSparseGrad(Correction):
    name: ClassVar[str] = "dense_sparse_grad"
    params: DenseSparseGradParams = field(default_factory=DenseSparseGradParams)

    def work(self, ctx: PassContext) -> PassContext:
        ly = backward_layer(ctx)
        return ctx if ly is None or ly.sparse is None else ctx.replace(nbytes=ctx.nbytes + ly.param_bytes)
