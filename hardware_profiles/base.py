"""What the profile format's parts share: the strict base model, the checks and the
interpolation of a curve's points, the op classes and the layer-kind keys.

Its own module so that :mod:`hardware_profiles.schema` (the profile) and
:mod:`hardware_profiles.corrections` (the corrections' parameters, a field of the
profile) can both build on it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

OP_CLASSES = ("gemm", "conv", "embedding", "elementwise", "attention")


class _Strict(BaseModel):
    # allow_inf_nan=False: Python's json module accepts NaN and Infinity, and an
    # infinite bandwidth or peak would silently make every cost zero.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _check_curve(xs: list[float], ys: list[float], x_name: str, y_max: float,
                 y_name: str = "eff", zero: bool = False) -> None:
    """A curve's points: non-empty, equal lengths, x positive and strictly increasing,
    every value in (0, y_max] (``zero``: in [0, y_max])."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"{x_name} and {y_name} must be non-empty lists of equal length")
    if any(f <= 0 for f in xs) or any(b <= a for a, b in pairwise(xs)):
        raise ValueError(f"{x_name} must be positive and strictly increasing")
    if any(not (0 <= e if zero else 0 < e) or e > y_max for e in ys):
        raise ValueError(f"{y_name} values must lie in {'[' if zero else '('}0, {y_max:g}]")


def _known_keys(v: dict[str, Any] | None, known: Sequence[str], what: str) -> dict[str, Any] | None:
    """``v`` unchanged if every key is one of ``known``; else a ValueError naming the
    first unknown ``what`` and the known ones."""
    for k in v or {}:
        if k not in known:
            raise ValueError(f"unknown {what} {k!r} (known: {', '.join(known)})")
    return v


def _log_interp(xs_: list[float], ys: list[float], x_: float) -> float:
    """Piecewise linear in log10(x) through the points, clamped at both ends."""
    if x_ <= xs_[0]:
        return ys[0]
    if x_ >= xs_[-1]:
        return ys[-1]
    x = math.log10(x_)
    xs = [math.log10(f) for f in xs_]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]  # pragma: no cover (guarded above)


class _Curve(_Strict):
    """Points (x, y), piecewise linear in log10(x), clamped at both ends. A subclass
    names its x and y fields (``_x``, ``_y``: the file format's keys), the largest value
    allowed (``_max``) and whether 0 is allowed (``_zero``)."""

    _x: ClassVar[str]
    _y: ClassVar[str] = "eff"
    _max: ClassVar[float]
    _zero: ClassVar[bool] = False

    @model_validator(mode="after")
    def _check(self) -> _Curve:
        _check_curve(getattr(self, self._x), getattr(self, self._y), self._x, self._max, self._y, self._zero)
        return self

    def at(self, x: float) -> float:
        """The curve's value at ``x`` (FLOPs, bytes or intensity of one call)."""
        return _log_interp(getattr(self, self._x), getattr(self, self._y), x)


_MEM_KEY_RE = re.compile(r"^(" + "|".join(OP_CLASSES) + r")/k\d+p?r?i?$")


def mem_key(op: str, kernels: int, has_params: bool, reduces: bool = False, inplace: bool = False) -> str:
    """Key of a layer kind in ``mem_efficiency``: ``OP/kN`` plus ``p`` when the
    layer has parameters, ``r`` when its output is smaller than its input
    (pooling) and ``i`` when it works in place, e.g. ``elementwise/k2p`` (two
    kernels, parameters: a BatchNorm), ``elementwise/k1i`` (``ReLU(inplace=True)``)."""
    return f"{op}/k{kernels}{'p' if has_params else ''}{'r' if reduces else ''}{'i' if inplace else ''}"


def check_kind_keys(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """``v`` unchanged if every key is an op class or a layer kind (:func:`mem_key`);
    else a ValueError naming the first other key."""
    for k in v or {}:
        if k not in OP_CLASSES and not _MEM_KEY_RE.match(k):
            raise ValueError(f"unknown key {k!r}: an op class ({', '.join(OP_CLASSES)}) "
                             "or OP/kN[p][r][i] (N kernels, p: parameters, r: reducing, i: in place)")
    return v
