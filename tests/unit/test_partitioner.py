"""The partition a client computes for its key is the one every producer sends it to.

``KafkaBackend.follow`` reads one ``events`` partition from the offset it recorded before
publishing; that partition comes from ``partition_for`` (Kafka's murmur2, the
``murmur2_random`` partitioner every callgate producer uses). The vectors are the Java
client's own (``UtilsTest.testMurmur2``); the Kafka tests also compare it with the
delivery report of every request they publish.
"""

from __future__ import annotations

import pytest

from callgate.adapters.kafka.client import murmur2, partition_for


def signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_matches_the_java_client(text: str, expected: int) -> None:
    assert signed(murmur2(text.encode())) == expected


def test_partition_is_the_positive_hash_modulo_the_count() -> None:
    key = b"k-0123456789abcdef"
    assert partition_for(key, 6) == (murmur2(key) & 0x7FFFFFFF) % 6
    assert {partition_for(f"i-{n}".encode(), 3) for n in range(50)} == {0, 1, 2}
    assert 0 <= partition_for(b"", 6) < 6
