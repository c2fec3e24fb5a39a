"""The fitted fields of a GPU profile, written in one place.

A GPU profile carries, besides its datasheet figures (peaks per math mode, bandwidth,
SMs), the parameters of the GPU cost model (``docs/modelling/gpu.md``):

==================================  ====================================================
field                               what it is
==================================  ====================================================
``efficiency.{conv,gemm,attention}``  fraction of the fp32 peak (CUDA cores)
``math_efficiency[mode][op]``       fraction of ``peak_flops[mode]`` per op class, for
                                    every math mode other than fp32 the profile has
``mem_efficiency[op]``              fraction of ``mem_bw_Bps`` memory-bound passes reach
                                    (one value, every op class)
``launch_overhead_s``               seconds per kernel launch
``corrections.layout_transpose``    passes over a convolution's activations that
                                    contiguous (NCHW) layout costs in fp16 and bf16
==================================  ====================================================

Two fits write them: :mod:`calibration.published` (to published training throughput,
the same values for every shipped GPU profile) and :mod:`calibration.gpu_fit` (to a
GPU's own measurements, ``hetsim calibrate``). Both go through
:func:`with_gpu_fields`, so a measured GPU profile has exactly the fields a published
one has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hardware_profiles.schema import DeviceProfile

#: The math modes of a GPU profile (``peak_flops`` keys), in the order profiles list them.
GPU_MODES = ("fp32", "tf32", "fp16", "bf16")

#: The op classes whose efficiency a GPU profile has per math mode.
MATMUL_CLASSES = ("conv", "gemm", "attention")

#: The op classes ``mem_efficiency`` gets its one value for.
MEM_OPS = ("gemm", "conv", "embedding", "elementwise", "attention")

#: The math modes whose convolutions pay the layout transposes in contiguous layout.
LAYOUT_MODES = ["fp16", "bf16"]


def fallbacks(modes: Sequence[str]) -> dict[str, str]:
    """``math_fallback`` of a GPU that has the math modes ``modes``: fp32 for every mode
    of :data:`GPU_MODES` it lacks (as the shipped T4 and V100 profiles say for tf32 and
    bf16)."""
    return {m: "fp32" for m in GPU_MODES if m not in modes}


def with_gpu_fields(base: DeviceProfile, efficiency: Mapping[str, float],
                    math_efficiency: Mapping[str, Mapping[str, float]], mem_eff: float,
                    launch_s: float, layout_passes: float | None,
                    source: Mapping[str, Any] | None = None) -> DeviceProfile:
    """``base`` with the GPU cost model's fitted fields written in.

    Args:
        base: the profile to write into (its other fields are kept).
        efficiency: fp32 efficiency per op class, merged into ``base.efficiency``
            (its other entries, e.g. ``embedding``, stay).
        math_efficiency: per math mode, the efficiency table; only the modes
            ``base.peak_flops`` has are written, in this mapping's order (none:
            no ``math_efficiency``).
        mem_eff: the one ``mem_efficiency`` value of every op class of :data:`MEM_OPS`.
        launch_s: ``launch_overhead_s``.
        layout_passes: ``corrections.layout_transpose.passes`` (modes
            :data:`LAYOUT_MODES`); None leaves ``base``'s corrections as they are.
        source: entries merged into ``base.source`` (None: unchanged).
    """
    data = base.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["efficiency"] = {**data.get("efficiency", {}), **efficiency}
    modes = {mode: dict(table) for mode, table in math_efficiency.items() if mode in base.peak_flops}
    if modes:
        data["math_efficiency"] = modes
    else:
        data.pop("math_efficiency", None)
    data["mem_efficiency"] = dict.fromkeys(MEM_OPS, mem_eff)
    data["launch_overhead_s"] = launch_s
    if layout_passes is not None:
        corr = dict(data.get("corrections") or {})
        corr["layout_transpose"] = {"passes": layout_passes, "modes": list(LAYOUT_MODES)}
        data["corrections"] = corr
    if source is not None:
        data["source"] = {**data["source"], **source}
    return DeviceProfile.model_validate(data)
