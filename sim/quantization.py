"""Gradient quantization: bytes on the wire and the bit-width policies.

Pure functions and small immutable policy objects; nothing here depends on the
simulator, so the cost model, the evaluators and the convergence model can all
use it.

Bytes on the wire
-----------------
A tensor (piece) of ``elements`` fp32 values sent with ``bits`` bits per value
takes::

    packed_bytes(elements, bits) = ceil(elements * bits / 8) + QUANT_META_BYTES

for ``bits < 32``: the values are bit-packed and rounded **up** to a whole byte,
then the scale metadata (an fp32 scale and an fp32 offset, 8 B) is appended.
With 32 bits nothing is quantized: ``4 * elements`` bytes, no rounding, no
metadata; an empty tensor is 0 bytes whatever the width (nothing is sent, so no
metadata either). ``elements`` may be fractional: a shard's key range can cut a
layer mid-value, and the rows a sparse batch touches need not be whole fp32
values; the ceiling is then taken on the packed size. To keep a product that is
integral in exact arithmetic from being bumped by float noise (``1/3 * 300``),
the ceiling forgives ``ROUND_SLACK_BYTES`` (1e-9 B).

Policies
--------
A :class:`QuantizationPolicy` maps ``(step, loss_history)`` to a bit width.

- :class:`Fixed` ``(bits)``: always ``bits`` (32 = no quantization).
- :class:`Adaptive`: the width follows the relative fall of the training loss
  over the last ``window`` observations (coarse while it falls fast, finer as
  it flattens); see :func:`adaptive_bits` for the exact rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

#: Bit widths a gradient may be sent with (32 = not quantized).
BIT_WIDTHS: tuple[int, ...] = (2, 4, 8, 16, 32)
#: Bytes of scale metadata per quantized tensor piece (an fp32 scale and an fp32 offset).
QUANT_META_BYTES = 8.0
#: Float noise below this many bytes does not push the packed size up to the next byte.
ROUND_SLACK_BYTES = 1e-9


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or int(bits) != bits or int(bits) not in BIT_WIDTHS:
        raise ValueError(f"bits must be one of {BIT_WIDTHS}, got {bits!r}")
    return int(bits)


def packed_bytes(elements: float, bits: int) -> float:
    """Bytes on the wire of one tensor piece of ``elements`` fp32 values at ``bits`` bits.

    ``ceil(elements * bits / 8) + QUANT_META_BYTES`` below 32 bits; ``4 * elements``
    at 32; 0 for an empty piece. See the module docstring for the rounding.
    """
    bits = _check_bits(bits)
    if elements < 0:
        raise ValueError(f"elements must be >= 0, got {elements!r}")
    if elements == 0:
        return 0.0
    if bits == 32:
        return 4.0 * float(elements)
    return float(math.ceil(elements * bits / 8.0 - ROUND_SLACK_BYTES)) + QUANT_META_BYTES


def packed_bytes_array(fp32_bytes: np.ndarray, bits: int) -> np.ndarray:
    """:func:`packed_bytes` element-wise over fp32 byte counts (``elements = fp32_bytes / 4``)."""
    bits = _check_bits(bits)
    fp32 = np.asarray(fp32_bytes, dtype=float)
    if bits == 32:
        return fp32.copy()
    packed = np.ceil(fp32 * (bits / 32.0) - ROUND_SLACK_BYTES) + QUANT_META_BYTES
    return np.where(fp32 > 0, packed, 0.0)


# -- policies --------------------------------------------------------------------


@runtime_checkable
class QuantizationPolicy(Protocol):
    """Chooses the bit width of the gradients pushed at ``step``.

    ``loss_history`` holds the training-loss observations so far, oldest first
    (whatever the caller observes: one per iteration, or one per interval).
    Implementations are pure: the same arguments give the same width.
    """

    def bits(self, step: int, loss_history: Sequence[float]) -> int: ...


@dataclass(frozen=True)
class Fixed:
    """Always the same width (32 = no quantization)."""

    width: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "width", _check_bits(self.width))

    def bits(self, step: int, loss_history: Sequence[float]) -> int:
        return self.width


def relative_loss_fall(loss_history: Sequence[float], window: int) -> float | None:
    """``r = (L[-window] - L[-1]) / |L[-window]|`` over the last ``window`` observations.

    None with fewer than ``window`` observations. 0 when ``L[-window]`` is 0.
    A rising loss gives ``r < 0``; a NaN or infinite loss anywhere in the window
    (a diverged run) gives NaN, which the level rule treats as flat (finest).
    """
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window!r}")
    if len(loss_history) < window:
        return None
    if not all(math.isfinite(float(x)) for x in loss_history[-window:]):
        return math.nan
    first, last = float(loss_history[-window]), float(loss_history[-1])
    if first == 0.0:
        return 0.0
    return (first - last) / abs(first)


def level_index(r: float, coarse_threshold: float, fine_threshold: float, n_levels: int) -> int:
    """Index into ascending ``levels`` (0 = coarsest) for a relative loss fall ``r``.

    - ``r >= coarse_threshold``: 0 (coarsest);
    - ``r <= fine_threshold`` or NaN: ``n - 1`` (finest);
    - in between, with ``n >= 3`` levels: the open interval is cut into ``n - 2``
      bands of equal width, the band next to ``coarse_threshold`` giving level 1
      and the one next to ``fine_threshold`` level ``n - 2``:
      ``1 + min(n - 3, floor(t * (n - 2)))`` with
      ``t = (coarse_threshold - r) / (coarse_threshold - fine_threshold)`` in (0, 1);
      with 2 levels, the finer one (only ``coarse_threshold`` matters).
    """
    n = n_levels
    if math.isnan(r) or r <= fine_threshold:
        return n - 1
    if r >= coarse_threshold:
        return 0
    if n == 2:
        return 1
    t = (coarse_threshold - r) / (coarse_threshold - fine_threshold)
    return 1 + min(n - 3, int(math.floor(t * (n - 2))))


@dataclass(frozen=True)
class Adaptive:
    """Bit width from the relative fall of the loss over a window.

    Attributes:
        window: observations the fall is measured over (``>= 2``):
            ``r = (L[-window] - L[-1]) / |L[-window]|``.
        coarse_threshold: ``r`` at or above which the coarsest level is used.
        fine_threshold: ``r`` at or below which the finest level is used
            (``< coarse_threshold``).
        levels: the widths to choose from, strictly ascending, from
            :data:`BIT_WIDTHS`; e.g. ``(2, 4, 8, 16, 32)`` or ``(4, 8, 16, 32)``.
        monotone: never go coarser again: the width is the largest the raw rule
            gave at any observation so far (every prefix of the history with at
            least ``window`` observations), so the result depends only on the
            history and stays pure.
        initial_bits: the width before ``window`` observations exist; None = the
            coarsest level (loss falls fastest early in training).

    Between the thresholds the levels are interpolated in equal bands of ``r``
    (:func:`level_index`).
    """

    window: int = 5
    coarse_threshold: float = 0.10
    fine_threshold: float = 0.01
    levels: tuple[int, ...] = (2, 4, 8, 16, 32)
    monotone: bool = True
    initial_bits: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 2:
            raise ValueError(f"window must be an integer >= 2, got {self.window!r}")
        if not (math.isfinite(self.coarse_threshold) and math.isfinite(self.fine_threshold)):
            raise ValueError("thresholds must be finite")
        if not self.fine_threshold < self.coarse_threshold:
            raise ValueError(f"fine_threshold ({self.fine_threshold}) must be below "
                             f"coarse_threshold ({self.coarse_threshold})")
        lv = tuple(self.levels)
        if len(lv) < 2:
            raise ValueError("levels needs at least two widths")
        for b in lv:
            _check_bits(b)
        if any(b >= c for b, c in zip(lv, lv[1:])):
            raise ValueError(f"levels must be strictly ascending, got {lv}")
        object.__setattr__(self, "levels", tuple(int(b) for b in lv))
        if self.initial_bits is not None and self.initial_bits not in lv:
            raise ValueError(f"initial_bits {self.initial_bits!r} is not one of levels {lv}")

    @property
    def start_bits(self) -> int:
        return self.levels[0] if self.initial_bits is None else int(self.initial_bits)

    def raw_bits(self, loss_history: Sequence[float]) -> int:
        """The rule on the last ``window`` observations only (no monotone memory)."""
        r = relative_loss_fall(loss_history, self.window)
        if r is None:
            return self.start_bits
        return self.levels[level_index(r, self.coarse_threshold, self.fine_threshold, len(self.levels))]

    def bits(self, step: int, loss_history: Sequence[float]) -> int:
        return adaptive_bits(loss_history, self)

    def trace(self, loss_history: Sequence[float]) -> list[int]:
        """The width after each observation: ``[bits(k, L[:k + 1]) for k]``."""
        return [adaptive_bits(loss_history[:k + 1], self) for k in range(len(loss_history))]


def adaptive_bits(loss_history: Sequence[float], policy: Adaptive) -> int:
    """The width :class:`Adaptive` ``policy`` gives after ``loss_history``.

    Not monotone: :meth:`Adaptive.raw_bits`. Monotone: the start width while
    fewer than ``window`` observations exist, then
    ``max(raw_bits(L[:k]) for k = window .. len(L))`` (the start width is a
    placeholder before any evidence and does not enter the maximum). As the
    level falls with ``r``, that is the level of the smallest ``r`` seen (or the
    finest if any window held a non-finite loss). Vectorised: O(len(history)) per call.
    """
    if not policy.monotone:
        return policy.raw_bits(loss_history)
    w = policy.window
    L = np.asarray(loss_history, dtype=float)
    if L.size < w:
        return policy.start_bits
    first, last = L[: L.size - w + 1], L[w - 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(first == 0.0, 0.0, (first - last) / np.abs(first))
    bad = np.lib.stride_tricks.sliding_window_view(~np.isfinite(L), w).any(axis=1)
    r = np.where(bad, np.nan, r)
    # level_index does not increase with r: the finest level any prefix reached is
    # the one of the smallest r (NaN counts as finest).
    worst = float("nan") if np.isnan(r).any() else float(r.min())
    return policy.levels[level_index(worst, policy.coarse_threshold, policy.fine_threshold,
                                     len(policy.levels))]


__all__ = [
    "BIT_WIDTHS",
    "QUANT_META_BYTES",
    "ROUND_SLACK_BYTES",
    "Adaptive",
    "Fixed",
    "QuantizationPolicy",
    "adaptive_bits",
    "level_index",
    "packed_bytes",
    "packed_bytes_array",
    "relative_loss_fall",
]
