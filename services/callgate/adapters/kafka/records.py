"""Kafka records in and out of a runner: the event an input record holds (or the dead letter
that stands for one that does not decode), and the record each output is produced as.

Apart from the runner because it is translation only: no client call, no transaction.
"""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from confluent_kafka import Message

from callgate.adapters import engine
from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.kafka.client import EventCodec
from callgate.adapters.kafka.topics import HEADER_TENANT, Topics
from callgate.adapters.view_codec import ViewCodec, ViewEncoder
from callgate.domain.events import Event
from callgate.domain.process_port import Output, ViewRecord
from callgate.tracing import TRACEPARENT

if TYPE_CHECKING:
    from callgate.tracing import Tracing

# A unit of work's record: (topic, key, value, headers beyond the transaction's token).
Record = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]


class Records:
    """The records of one process (``process``, the dead letters' producer) over ``topics``;
    ``reacts_to``: the event types its ``handle`` can change anything for (None: all)."""

    def __init__(
        self,
        process: str,
        codec: EventCodec,
        views: ViewEncoder | None,
        topics: Topics,
        reacts_to: Set[type[Event]] | None,
        tracing: Tracing | None,
    ) -> None:
        self._process = process
        self._codec = codec
        self._views = views if views is not None else ViewCodec.default()
        self._topics = topics
        self._reacts_to = reacts_to
        self._tracing = tracing

    def passed_over(self, value: bytes, logical: str) -> bool:
        """Whether a record of ``logical`` can be consumed and committed undecoded: its type
        header names a type that belongs on the topic and that ``handle`` ignores."""
        if self._reacts_to is None:
            return False
        kind = self._codec.event_class_of(value)
        # A corrupt body is dead-lettered by the readers that react to its type (every type
        # of every topic has one: tests/unit/test_reacts_to.py); a type on the wrong topic,
        # or an unknown header, is decoded and dead-lettered by ``decode``.
        return kind is not None and logical == kind.TOPIC and kind not in self._reacts_to

    def decode(
        self, msg: Message, source: tuple[str, int, int], dead_id: str, now: int
    ) -> Event | Record:
        """The event of the record read at ``source`` (logical topic, partition, offset), or
        the dead-letter record that replaces it when it does not decode, is on the wrong
        topic, or is keyed by other than the event's ``partition_key`` (with the reason, the
        source and the original bytes)."""
        value = msg.value() or b""
        try:
            event = engine.decode_input(self._codec.decode, value, source[0])
            if msg.key() != event.partition_key.encode():
                # Its state lives under partition_key: on another partition it would split.
                raise MalformedEvent("record key is not the event's partition_key")
        except MalformedEvent as exc:
            raw_key = msg.key()
            keys = ("", (raw_key or b"").decode("utf-8", "replace"))
            dead = engine.malformed(dead_id, source, value, keys, self._process, exc.reason, now)
            # keyed by the record's own key, whatever its bytes
            return self._topics.physical(dead.TOPIC), raw_key, self._codec.encode(dead), []
        return event

    def encode(self, out: Output) -> Record:
        """The Kafka record of an output: an event to its topic keyed by ``partition_key``
        (with the invocation's trace context, when traced), a view record to its view's
        topic ``<prefix>.view.<view>`` keyed by view key (Avro of the view's published
        schema, ``ViewCodec``; None: a tombstone) with its tenant, when known, in the
        ``cg-tenant`` header (ADR 0016)."""
        if isinstance(out, ViewRecord):
            value = None if out.value_json is None else self._views.encode(out.view, out.value_json)
            tenant = [(HEADER_TENANT, out.tenant.encode())] if out.tenant else []
            return self._topics.view(out.view), out.key.encode(), value, tenant
        trace: list[tuple[str, bytes]] = []
        if self._tracing is not None:  # the invocation's context travels on
            traceparent = self._tracing.of(out.invocation_id)
            if traceparent is not None:
                trace = [(TRACEPARENT, traceparent.encode())]
        encoded = self._codec.encode(out)
        return self._topics.physical(out.TOPIC), out.partition_key.encode(), encoded, trace
