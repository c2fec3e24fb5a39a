"""``wave_quantization``: a GEMM or convolution too small to fill every SM in its last wave.

    tiles    = ceil(M / tile_m) * ceil(N / tile_n)
    waves    = ceil(tiles / sms)
    util     = tiles / (waves * sms)
    compute_s = compute_s / util

A GPU runs a matrix product as output tiles, one thread block per tile and one block
per streaming multiprocessor (SM) at a time: a product of ``tiles`` tiles takes
``waves`` rounds however few tiles the last round has, so it reaches ``util`` of the
rate a large product reaches (Habitat's wave scaling, ATC'21). ``M x N`` is the pass's
output: for a layer with parameters, ``M = batch * positions`` (positions =
``fwd_flops / (2 * weights)``: pixels of a convolution's output, tokens of a Linear's
input) and ``N`` its output features (``activation_bytes / 4 / positions``) in the
forward; in the backward the input gradient's ``M x K`` (``K = weights / N``, its input
features times the window), whose tile count the weight gradient's split-K kernels do
not fall below. Layers without parameters (batched matmuls of attention) and passes
without FLOPs are left as they are. Reads ``corrections.wave_quantization``: ``{"sms":
SMs, "tile_m": 128, "tile_n": 128}``
(:class:`hardware_profiles.corrections.WaveQuantizationParams`), written into GPU
profiles from their datasheets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from hardware_profiles.corrections import WaveQuantizationParams
from sim.corrections.base import Correction, PassContext

_MATMUL = frozenset({"gemm", "conv"})


def gemm_dims(ctx: PassContext) -> tuple[float, float] | None:
    """The output ``(M, N)`` of the pass's matrix product (see the module docstring), or
    None for a pass that is not one of a layer with parameters."""
    ly = ctx.layer
    if ly is None or ly.op not in _MATMUL or ly.param_bytes <= 0 or ly.fwd_flops <= 0 or ctx.flops <= 0:
        return None
    weights = ly.param_bytes / 4.0
    positions = ly.fwd_flops / (2.0 * weights)
    n_out = ly.activation_bytes / 4.0 / positions
    if n_out <= 0:
        return None
    m = ctx.batch * positions
    return (m, n_out) if ctx.phase == "fwd" else (m, weights / n_out)


def utilization(m: float, n: float, sms: int, tile_m: int, tile_n: int) -> float:
    """The fraction of the SMs' tile slots that an ``m x n`` product fills over its waves."""
    tiles = math.ceil(m / tile_m - 1e-9) * math.ceil(n / tile_n - 1e-9)
    if tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / sms) * sms)


@dataclass(frozen=True)
class WaveQuantization(Correction):
    name: ClassVar[str] = "wave_quantization"
    params: WaveQuantizationParams

    def terms(self, ctx: PassContext) -> PassContext:
        dims = gemm_dims(ctx)
        if dims is None:
            return ctx
        p = self.params
        u = utilization(dims[0], dims[1], p.sms, p.tile_m, p.tile_n)
        return ctx if u >= 1.0 else ctx.replace(compute_s=ctx.compute_s / u)
