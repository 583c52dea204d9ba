"""The runners' cache of committed states holds the keys in use and no more: at most
``limit`` keys, none untouched for more than ``idle_s`` (``adapters.unit_of_work``)."""

from __future__ import annotations

from callgate.adapters.unit_of_work import StateCache


def _cache(limit: int = 100, idle_s: float = 60.0) -> tuple[StateCache[str], list[float]]:
    now = [0.0]
    return StateCache(limit, idle_s, clock=lambda: now[0]), now


def test_a_taken_state_leaves_the_cache_until_it_is_kept_again() -> None:
    cache, _ = _cache()
    cache.keep([("a", {"n": 1}, b"1")])
    assert cache.take("a") == ({"n": 1}, b"1")
    assert cache.take("a") is None
    assert len(cache) == 0


def test_past_its_limit_the_least_recently_used_key_leaves_first() -> None:
    cache, _ = _cache(limit=2)
    cache.keep([("a", 1, None), ("b", 2, None)])
    cache.keep([("a", 1, None)])  # used again: b is now the oldest
    cache.keep([("c", 3, None)])
    assert (cache.take("b"), cache.take("a"), cache.take("c")) == (None, (1, None), (3, None))


def test_a_key_untouched_for_longer_than_idle_s_leaves_at_the_next_keep() -> None:
    cache, now = _cache(idle_s=60.0)
    cache.keep([("old", 1, None)])
    now[0] = 30.0
    cache.keep([("used", 2, None)])
    now[0] = 60.0
    cache.keep([("new", 3, None)])
    assert len(cache) == 3  # nothing idle for more than 60 s yet
    now[0] = 60.5
    cache.keep([("newer", 4, None)])
    assert cache.take("old") is None
    assert len(cache) == 3


def test_under_a_steady_stream_of_new_keys_the_cache_holds_about_idle_s_of_them() -> None:
    """25 new keys a second for ten minutes: the cache stops growing within its first
    minute, far below its key limit (the soak's flat memory)."""
    cache, now = _cache(limit=16_384, idle_s=60.0)
    sizes = []
    for second in range(600):
        now[0] = float(second)
        for k in range(25):
            cache.keep([(f"{second}-{k}", None, None)])
        sizes.append(len(cache))
    assert max(sizes) == 61 * 25
    assert sizes[61] == sizes[-1] == 61 * 25
