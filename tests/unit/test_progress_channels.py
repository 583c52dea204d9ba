"""What an upstream's progress may carry to the agent (``providers.progress``): finite
numbers and a bounded message; anything else is dropped and the call goes on."""

from __future__ import annotations

import math

from callgate.providers.progress import MESSAGE_CHARS, ProgressChannels


def test_a_channel_passes_finite_progress_and_cuts_the_message() -> None:
    sent: list[tuple[float, float | None, str | None]] = []
    channels = ProgressChannels()
    channels.open("inv-1", lambda p, t, m: sent.append((p, t, m)))
    send = channels.of("inv-1")
    assert send is not None
    send(1, 3, "one")
    send(2.5, None, "x" * (MESSAGE_CHARS + 50))
    assert sent == [(1.0, 3.0, "one"), (2.5, None, "x" * MESSAGE_CHARS)]


def test_hostile_progress_is_dropped() -> None:
    sent: list[object] = []
    channels = ProgressChannels()
    channels.open("inv-1", lambda *a: sent.append(a))
    send = channels.of("inv-1")
    assert send is not None
    for progress, total in ((math.nan, 3.0), (math.inf, None), (1.0, -math.inf), (True, 2.0)):
        send(progress, total, "hostile")
    assert sent == []
    send(1.0, 2.0, 12345)  # type: ignore[arg-type]  # a message that is not text
    assert sent == [(1.0, 2.0, None)]


def test_a_closed_or_unknown_invocation_has_no_channel() -> None:
    channels = ProgressChannels()
    channels.open("inv-1", lambda *a: None)
    channels.close("inv-1")
    assert channels.of("inv-1") is None
    assert channels.of("inv-other") is None
