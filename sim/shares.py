"""Apportionment: integer shares of a global batch in proportion to weights.

The one implementation of largest-remainder rounding in hetsim. Schedulers
(schedulers/) split the batch by measured or modelled rates; the runtime's
PS (runtime/ps.py) redistributes the shares of failed workers. Both import
it from here, the lowest layer they share, since neither may import the
other.

Every function is deterministic: quotas are floored and the units left over
go to the largest remainders, ties to the lower index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def largest_remainder(weights: Sequence[float] | np.ndarray, total: int) -> list[int]:
    """Non-negative integers proportional to ``weights`` that sum to ``total``.

    Floors of the exact quotas, then one more to the largest remainders
    (ties to the lower index), so the result is deterministic.
    """
    return capped_largest_remainder(weights, [None] * len(weights), total)[0]


def capped_largest_remainder(weights: Sequence[float] | np.ndarray, caps: Sequence[int | None],
                             total: int) -> tuple[list[int], int]:
    """Integers proportional to ``weights`` summing to ``total`` with ``share_i <= caps[i]``.

    Water-filling: shares proportional to weight; every share above its cap is
    fixed at the cap and the remainder is spread over the uncapped workers in
    proportion to their weights, until no cap is violated. Then the quotas are
    rounded by largest remainder (ties to the lower index) without passing a
    cap. A weight of 0 gets 0; a cap of None is no cap. If the caps of the
    positive-weight workers cannot hold ``total``, every such worker gets its
    cap.

    Returns:
        (shares, short): ``short = total - sum(shares)``, 0 unless memory is short.
    """
    w = np.asarray(weights, dtype=float)
    if total < 0 or w.size == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, finite and not all zero; total >= 0")
    if len(caps) != w.size or any(c is not None and c < 0 for c in caps):
        raise ValueError("one non-negative cap (or None) per weight")
    cap = np.array([float(total) if c is None else float(min(c, total)) for c in caps])
    cap[w <= 0] = 0.0
    if cap.sum() <= total:
        shares = [int(x) for x in cap]
        return shares, total - sum(shares)
    quota = np.zeros(w.size)
    fixed = np.zeros(w.size, dtype=bool)
    fixed[w <= 0] = True
    while True:
        free = ~fixed
        if not free.any():
            break
        rest = total - cap[fixed & (w > 0)].sum()
        quota[free] = w[free] / w[free].sum() * rest
        over = free & (quota > cap)
        if not over.any():
            break
        fixed |= over
        quota[over] = cap[over]
    quota[w <= 0] = 0.0
    base = np.minimum(np.floor(quota), cap).astype(int)
    short = total - int(base.sum())
    order = sorted(range(w.size), key=lambda i: (-(quota[i] - base[i]), i))
    while short > 0:  # one pass suffices in exact arithmetic; more guard float rounding
        progress = False
        for i in order:
            if short > 0 and base[i] + 1 <= cap[i] and w[i] > 0:
                base[i] += 1
                short -= 1
                progress = True
        if not progress:
            break
    return [int(x) for x in base], short


def proportional_fill(shares: Sequence[int], alive: Sequence[bool], total: int) -> list[int]:
    """Shares of the live workers scaled to sum to ``total`` (:func:`largest_remainder`);
    failed workers get 0. Equal split when no live worker had a share; all 0 when no
    worker is alive."""
    w = [float(s) if a else 0.0 for s, a in zip(shares, alive)]
    if sum(w) <= 0:
        w = [1.0 if a else 0.0 for a in alive]
    if sum(w) <= 0:
        return [0] * len(shares)
    return largest_remainder(w, total)
