"""Log rows decoded once per runner, however many processes read them.

Rows never change once committed, so while the runner holds the lock a decoded row stays
valid until every process has consumed it. A row that does not decode (or is on the wrong
topic) is kept as its reason, so each reader dead-letters it without decoding it again; its
dead letter is written once however many processes read it (``DecodedRows.event``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.engine import decode_input, malformed
from callgate.domain.events import Event

if TYPE_CHECKING:
    from callgate.adapters.embedded.store import InputRow, StoreTx
    from callgate.adapters.unit_of_work import UnitOfWork

# Bound on the rows kept if some process lags far behind the others.
MAX_ROWS = 20_000


class Poison:
    """A row that does not decode (or is on the wrong topic), with the reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class DecodedRows:
    """Decoded events (or ``Poison``) by ``seq``, dropped once every process consumed them."""

    __slots__ = ("_decode", "_order", "_rows")

    def __init__(self, decode: Callable[[bytes], Event]) -> None:
        self._decode = decode
        self._rows: dict[int, Event | Poison] = {}
        self._order: deque[int] = deque()  # the keys of ``_rows``, as inserted

    def get(self, seq: int, topic: str, payload: bytes) -> Event | Poison:
        decoded = self._rows.get(seq)
        if decoded is None:
            try:
                decoded = decode_input(self._decode, payload, topic)
            except MalformedEvent as exc:
                decoded = Poison(exc.reason)
            self._rows[seq] = decoded
            self._order.append(seq)
        return decoded

    def event(
        self, tx: StoreTx, row: InputRow, unit: UnitOfWork[str, Any], now: int
    ) -> Event | None:
        """The event of ``row``, or None for one that does not decode: its dead letter
        (``malformed_event``, with the reason and the original bytes) goes into ``unit``
        when no process has written it yet (``StoreTx.claim_dead_letter``)."""
        seq, topic, partition_key, invocation_id, payload, _ = row
        decoded = self.get(seq, topic, payload)
        if isinstance(decoded, Poison):
            # Deterministic id: a rebuilt log (replay) names the same dead-letter the same way.
            if tx.claim_dead_letter(topic, seq):
                unit.add([malformed(
                    f"dead-letter-{topic}-{seq}", (topic, 0, seq), payload,
                    (invocation_id or "", partition_key), unit.process.name, decoded.reason, now,
                )])  # fmt: skip
            return None
        return decoded

    def prune(self, positions: Iterable[int]) -> None:
        """Drop the rows every process has consumed (``positions``: one per process, or
        none while some process has no position yet), or all of them past the bound."""
        if len(self._rows) > MAX_ROWS:
            self.clear()
            return
        low = min(positions, default=None)
        if low is None:
            return
        rows, order = self._rows, self._order
        # Rows are decoded in nearly ascending ``seq``: drop from the oldest while consumed
        # (a straggler stays until the rows before it are gone, or the bound clears all).
        while order and order[0] <= low:
            del rows[order.popleft()]

    def clear(self) -> None:
        self._rows.clear()
        self._order.clear()
