"""Pure parts of the HTTP surface: the code table, the options, the token bucket."""

from __future__ import annotations

import pytest

from callgate.domain.codes import TERMINAL, Code
from callgate.surfaces.http.context import HttpOptions
from callgate.surfaces.http.errors import STATUS
from callgate.surfaces.http.guard import RateLimit


def test_every_code_has_one_status_and_only_non_refusals_are_200() -> None:
    assert set(STATUS) == set(Code)
    ok = {c for c, s in STATUS.items() if s == 200}
    # ``permitted``: an AuthZEN evaluation's outcome, not a refusal (ADR 0083).
    ok_codes = {Code.ALLOWED, Code.EXECUTED, Code.REPLAYED, Code.APPROVAL_REQUIRED, Code.PERMITTED}
    assert ok == ok_codes
    assert all(400 <= STATUS[c] < 600 for c in TERMINAL - ok)


def test_options_from_the_flag_and_the_environment() -> None:
    env = {"CALLGATE_HTTP_RATE_BURST": "7", "CALLGATE_HTTP_CORS_ORIGINS": "https://a,https://b"}
    options = HttpOptions.from_env("0.0.0.0:9000", env)
    assert (options.host, options.port, options.rate_burst) == ("0.0.0.0", 9000, 7)
    assert options.cors_origins == ("https://a", "https://b")
    assert HttpOptions.from_env("[::1]:8787", {}).host == "::1"
    assert HttpOptions.from_env("127.0.0.1:8787", {}).cors_origins == ()


@pytest.mark.parametrize("bind", ["localhost", ":80", "host:", "host:port", "h:99999"])
def test_a_bad_address_is_refused(bind: str) -> None:
    with pytest.raises(ValueError):
        HttpOptions.from_env(bind, {})


def test_the_token_bucket_refills_at_its_rate() -> None:
    limit = RateLimit(app=None, rate_per_s=2.0, burst=2)  # type: ignore[arg-type]
    assert limit.take("a", 0.0) == 0 and limit.take("a", 0.0) == 0
    assert limit.take("a", 0.0) == pytest.approx(0.5)  # empty: one token in half a second
    assert limit.take("b", 0.0) == 0  # another client has its own bucket
    assert limit.take("a", 1.0) == 0  # refilled


def test_the_address_bucket_is_larger_and_shared() -> None:
    limit = RateLimit(app=None, rate_per_s=1.0, burst=1)  # type: ignore[arg-type]
    assert [limit.take("a:1.2.3.4", 0.0, factor=4) for _ in range(4)] == [0, 0, 0, 0]
    assert limit.take("a:1.2.3.4", 0.0, factor=4) == pytest.approx(0.25)
