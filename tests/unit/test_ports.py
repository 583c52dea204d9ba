"""The ports tests and benchmarks start their servers on (``tools/ports.py``)."""

from __future__ import annotations

import socket

from tools.ports import _ephemeral_start, free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(port < _ephemeral_start() for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when returned: raises if it is not


def test_a_port_in_use_is_never_returned() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_ports(1)[0]))
        held.listen()
        taken = held.getsockname()[1]
        assert all(taken not in free_ports(20) for _ in range(20))
