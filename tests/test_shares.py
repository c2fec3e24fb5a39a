"""sim/shares.py: the one largest-remainder apportionment (schedulers and the runtime's PS)."""

from __future__ import annotations

import pytest

from sim.shares import capped_largest_remainder, largest_remainder, proportional_fill


def test_schedulers_and_runtime_use_the_one_implementation() -> None:
    import runtime.ps
    import schedulers.base

    assert schedulers.base.largest_remainder is largest_remainder
    assert schedulers.base.capped_largest_remainder is capped_largest_remainder
    assert runtime.ps.proportional_fill is proportional_fill


def test_proportional_fill_hand_cases() -> None:
    # worker 1 failed: quotas 6.67, 0, 3.33 of 10; floors 6, 0, 3 leave 1 -> remainder 0.67 (index 0)
    assert proportional_fill([4, 4, 2], [True, False, True], 10) == [7, 0, 3]
    # no live worker had a share: equal split of the live ones, quotas 2.5, 2.5 -> the tie to index 0
    assert proportional_fill([0, 0, 0], [True, True, False], 5) == [3, 2, 0]
    # shares that already sum to the total stay as they are
    assert proportional_fill([3, 1], [True, True], 4) == [3, 1]
    # a live worker without a share keeps none: quotas 3.5, 0, 3.5 -> [4, 0, 3]
    assert proportional_fill([5, 0, 5], [True, True, True], 7) == [4, 0, 3]
    # nobody alive: nothing to hand out
    assert proportional_fill([2, 2], [False, False], 4) == [0, 0]


def test_capped_largest_remainder_hand_cases() -> None:
    # quotas 3, 3, 3 of 9; worker 0 capped at 2, its 1 spread: 3.5, 3.5 -> floors 2, 3, 3 leave 1,
    # remainders 0, 0.5, 0.5 -> index 1
    assert capped_largest_remainder([1, 1, 1], [2, None, None], 9) == ([2, 4, 3], 0)
    # the caps hold 5 of 10: everyone at the cap, 5 short
    assert capped_largest_remainder([1, 1], [2, 3], 10) == ([2, 3], 5)
    # a zero weight gets 0 whatever its cap
    assert capped_largest_remainder([0, 1], [5, None], 4) == ([0, 4], 0)
    with pytest.raises(ValueError):
        capped_largest_remainder([1, 1], [None], 4)
    with pytest.raises(ValueError):
        capped_largest_remainder([1, 1], [None, -1], 4)
    assert largest_remainder([2, 1], 6) == [4, 2]
