"""The decision of ``make bench-guard`` (ADR 0076): the ratio of the two medians against its
bound, failing closed when there is no ratio to compare."""

from __future__ import annotations

import math

from tools.bench_guard import BOUND, verdict


def test_a_ratio_at_or_below_the_bound_passes() -> None:
    assert verdict(2.0, 7.0, BOUND) == (True, 3.5)
    assert verdict(2.0, 2.0 * BOUND, BOUND) == (True, BOUND)


def test_a_ratio_above_the_bound_fails() -> None:
    ok, ratio = verdict(2.0, 2.0 * BOUND + 0.01, BOUND)
    assert not ok and ratio > BOUND
    assert verdict(1.0, 7.0, 6.0) == (False, 7.0)


def test_no_direct_time_to_divide_by_fails_closed() -> None:
    for direct in (0.0, -1.0, math.nan, math.inf):
        assert verdict(direct, 5.0, BOUND) == (False, math.inf)
    assert verdict(1.0, math.nan, BOUND)[0] is False
    assert verdict(1.0, math.inf, BOUND)[0] is False
