"""``make bench-compare``: a bench row's figure and direction, and the verdict on medians."""

from __future__ import annotations

from tools.bench_compare import Figure, compared, figure


def test_a_rate_is_better_higher_and_a_time_or_size_lower() -> None:
    assert figure("1,798/s") == Figure(1798.0, higher_is_better=True)
    assert figure("78,495 events/s") == Figure(78495.0, higher_is_better=True)
    assert figure("11.1 / 30.6 ms") == Figure(11.1, higher_is_better=False)
    assert figure("148 MB") == Figure(148.0, higher_is_better=False)
    # A ratio of two rates: the first figure is a rate.
    assert figure("1,026 / 2,130 proposals/s = 48%") == Figure(1026.0, higher_is_better=True)
    # A ratio of two times is a time, whatever follows the "=".
    assert figure("15.4 / 18.5 µs = 0.83x") == Figure(15.4, higher_is_better=False)


def test_a_value_without_a_number_has_no_figure() -> None:
    assert figure("docs/latency.png") is None
    assert figure("FAILED") is None


def test_worse_by_more_than_the_tolerance_is_not_within_it() -> None:
    rows = compared(
        {"rate": ["1,000/s", "1,100/s", "900/s"], "time": ["10 ms", "10 ms", "10 ms"]},
        {"rate": ["940/s", "960/s", "930/s"], "time": ["10.4 ms", "10.6 ms", "10.5 ms"]},
        5.0,
    )
    by = {r.measure: r for r in rows}
    assert not by["rate"].within and round(by["rate"].change_pct, 1) == -6.0
    assert by["time"].within and round(by["time"].change_pct, 1) == 5.0


def test_better_is_within_whatever_its_size() -> None:
    rows = compared(
        {"rate": ["100/s"], "time": ["50 ms"]}, {"rate": ["300/s"], "time": ["5 ms"]}, 5.0
    )
    assert all(r.within for r in rows)


def test_a_measure_on_one_side_only_is_not_judged() -> None:
    [row] = compared({}, {"new": ["12 ms"]}, 5.0)
    assert row.before is None and row.within
