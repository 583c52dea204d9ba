"""Loopback ports for the servers that tests and benchmarks start.

A port picked by binding port 0 comes from the kernel's ephemeral range, the same range
outgoing connections take their local ports from: between the pick and the server's own
bind, any client on the machine (another test worker's HTTP or Kafka client) may take it,
and the server then exits with "address already in use". The ports here come from below
that range, where only servers that chose the port bind.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now and outside the ephemeral range
    (all held at once while picked)."""
    top = _ephemeral_start() - 1
    if top <= _LOWEST:  # an unusual range: the kernel's pick is all there is
        top, picks = 0, [0] * count
    else:
        picks = random.sample(range(_LOWEST, top), min(count * 50, top - _LOWEST))
    held: list[socket.socket] = []
    try:
        for port in picks:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
            if len(held) == count:
                return [int(h.getsockname()[1]) for h in held]
        raise RuntimeError(f"no {count} free loopback ports below {top + 1}")
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """One loopback port free right now, outside the ephemeral range."""
    return free_ports(1)[0]


def wait_port(
    port: int, proc: subprocess.Popen[bytes], log: Path | None = None, timeout_s: float = 60.0
) -> None:
    """Wait until ``proc`` listens on loopback ``port``; raises when it exits first (with
    the end of ``log``, its output) or does not listen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}: {said}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s} s")
