"""The fault campaigns' workload reaches the run's usage limit however few flows a slow
broker lets it launch (tools.chaos.pick_kind)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from tools.chaos import BUDGET_EVERY, BURST, draw_kind, limit_max, pick_kind
from tools.network_faults import pick


def _enough(kinds: list[str], proposals: int) -> bool:
    return kinds.count("budget") * BURST > limit_max(proposals)


@given(st.integers(min_value=1, max_value=100_000), st.integers(min_value=0, max_value=2**32))
def test_the_flows_that_pass_the_limit_come_first(proposals: int, seed: int) -> None:
    rng = random.Random(seed)
    first = BUDGET_EVERY * (limit_max(proposals) // BURST + 1)
    assert _enough([pick_kind(rng, i, proposals) for i in range(first)], proposals)


@given(st.integers(min_value=1, max_value=100_000), st.integers(min_value=0, max_value=2**32))
def test_the_network_campaign_never_sends_a_budget_flow_upstream(proposals: int, seed: int) -> None:
    rng = random.Random(seed)
    first = BUDGET_EVERY * (limit_max(proposals) // BURST + 1)
    assert _enough([pick(rng, i, proposals) for i in range(first)], proposals)


def test_past_the_first_flows_the_kinds_are_drawn_at_their_shares() -> None:
    rng = random.Random(1)
    proposals = 1_000
    start = BUDGET_EVERY * (limit_max(proposals) // BURST + 1)
    kinds = [pick_kind(rng, i, proposals) for i in range(start, start + 20_000)]
    assert 0.03 < kinds.count("budget") / len(kinds) < 0.07
    assert 0.17 < kinds.count("create") / len(kinds) < 0.23


def test_the_soak_draws_the_same_mix_from_its_first_flow() -> None:
    rng = random.Random(3)
    kinds = [draw_kind(rng) for _ in range(20_000)]
    assert 0.03 < kinds[:5_000].count("budget") / 5_000 < 0.07
