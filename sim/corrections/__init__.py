"""The cost model's corrections: what it adds to or changes in the roofline of a pass.

One module per correction, its formula in its docstring; :mod:`sim.corrections.base`
says how they apply (:class:`~sim.corrections.base.PassContext`,
:class:`~sim.corrections.base.Correction`). A profile lists the ones it applies, with
their parameters, under ``corrections`` (:mod:`hardware_profiles.corrections`);
:func:`corrections_of` makes them. ``docs/modelling/cost_model.md`` has the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from hardware_profiles import DeviceProfile
from sim.corrections.base import Correction, PassContext, per_kind
from sim.corrections.call_overhead import CallOverhead
from sim.corrections.cold_calls import ColdCalls
from sim.corrections.dense_sparse_grad import DenseSparseGrad
from sim.corrections.glue import Glue
from sim.corrections.layout_transpose import LayoutTranspose
from sim.corrections.row_cost import RowCost
from sim.corrections.skinny_gemm import SkinnyGemm
from sim.corrections.wave_quantization import WaveQuantization
from sim.corrections.weight_grad_only_bwd import WeightGradOnlyBwd

__all__ = [
    "REGISTRY",
    "CallOverhead",
    "ColdCalls",
    "Correction",
    "DenseSparseGrad",
    "Glue",
    "LayoutTranspose",
    "PassContext",
    "RowCost",
    "SkinnyGemm",
    "WaveQuantization",
    "WeightGradOnlyBwd",
    "corrections_of",
    "per_kind",
]

#: Every correction, in the order they apply: the work corrections first (a
#: replacement of the bytes, weight_grad_only_bwd, after an addition to them), then
#: the roofline's terms, then the extra seconds, summed in this order (call overhead,
#: row cost, glue, cold calls: the order of the schema 1 cost model's sum, which keeps
#: every price the same to the last bit; the GPU terms after them).
REGISTRY: tuple[type[Correction], ...] = (
    DenseSparseGrad, WeightGradOnlyBwd, SkinnyGemm, WaveQuantization, CallOverhead, RowCost, Glue,
    ColdCalls, LayoutTranspose)

_CACHE: dict[int, tuple[object, tuple[Correction, ...]]] = {}


def corrections_of(profile: DeviceProfile, exclude: Iterable[str] = ()) -> tuple[Correction, ...]:
    """The corrections ``profile`` lists (``profile.corrections``), in :data:`REGISTRY`
    order, each with its parameters; none for a datasheet profile. ``exclude``: names
    left out (the calibration prices a layer's own time without ``glue``)."""
    skip = frozenset(exclude)
    key = id(profile.corrections)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not profile.corrections:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        listed = profile.corrections
        made = tuple(cls(params)  # type: ignore[call-arg]
                     for cls in REGISTRY if (params := getattr(listed, cls.name)) is not None)
        hit = _CACHE[key] = (listed, made)  # holding the object keeps its id unique
    return tuple(c for c in hit[1] if c.name not in skip) if skip else hit[1]
