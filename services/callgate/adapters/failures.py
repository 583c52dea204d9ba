"""Failure classification, shared by both runners (docs/adr/0012-failure-classification.md).

A runner that calls ``process.handle`` on an input and gets an exception must decide between
two things, and both runners decide here, the same way:

- ``Transient``: the infrastructure failed (broker, disk, database, a provider timing out,
  memory). Running again later can succeed, so the runner aborts and retries the input; it
  never drops it.
- ``Deterministic``: the input itself cannot be processed. ``handle`` is a pure function of
  (state, event, now), so running it again gives the same exception: retrying would stall
  the partition for every tenant. The runner dead-letters the input with its reason
  (``EventDeadLettered``) and moves on; when the input was a client request, it also gives
  the caller a coded outcome on the ``events`` topic (``answers``), which the status and
  decisions views report. A caller is never left waiting, and never told ``allowed``, for a
  call that was dropped.

The rule: an exception is transient only if it is one of the infrastructure kinds below;
everything else that escapes a process is deterministic. The default is deterministic on
purpose: process code does no I/O (functional core), so an unknown exception from it is a
bug or a hostile input, and neither goes away by retrying.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json, derive_id
from callgate.domain.codes import INFRASTRUCTURE_ERRORS, Code, Rejection, Unanswerable

# Infrastructure failures: the same input can succeed once the infrastructure is back.
TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    *INFRASTRUCTURE_ERRORS,  # disk, sockets, a locked or busy database, memory
    BufferError,  # a full producer queue
)
# Codes a dropped request may carry (docs/contract.md vocabulary); anything else is malformed_event.
ANSWER_CODES = frozenset({Code.INVALID_ARGUMENTS, Code.UNAUTHENTICATED, Code.MALFORMED_EVENT})
_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class Transient:
    """Retry the input: the infrastructure failed, not the input."""

    reason: str


@dataclass(frozen=True, slots=True)
class Deterministic:
    """Dead-letter the input. ``code`` is what the caller is told; ``answer`` is False when
    the input must not be answered under its own ids (``Unanswerable``)."""

    code: Code
    reason: str
    answer: bool = True


def classify(exc: BaseException) -> Transient | Deterministic:
    """The one rule both runners apply to an exception out of ``handle`` (module docstring)."""
    if isinstance(exc, TRANSIENT_TYPES) or _is_broker_error(exc):
        return Transient(describe(exc))
    if isinstance(exc, Unanswerable):
        return Deterministic(exc.code, exc.message, answer=False)
    if isinstance(exc, Rejection):
        code = exc.code if exc.code in ANSWER_CODES else Code.MALFORMED_EVENT
        return Deterministic(code, exc.message)
    if isinstance(exc, UnicodeError):
        return Deterministic(Code.INVALID_ARGUMENTS, f"text is not valid Unicode: {describe(exc)}")
    return Deterministic(Code.MALFORMED_EVENT, describe(exc))


def _is_broker_error(exc: BaseException) -> bool:
    """A ``KafkaException``: broker errors (the Kafka runner handles fatal and fenced ones).

    Read from ``sys.modules`` so that the embedded backend does not load librdkafka: while
    ``confluent_kafka`` is not imported, no exception can be one of its own.
    """
    kafka = sys.modules.get("confluent_kafka")
    return kafka is not None and isinstance(exc, kafka.KafkaException)


def describe(exc: BaseException) -> str:
    """A bounded one-line reason: the exception type and the start of its message."""
    text = f"{type(exc).__name__}: {exc}"
    text = text.encode("utf-8", "replace").decode("utf-8")  # a reason must encode, too
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."


def answers(event: ev.Event, failure: Deterministic, producer: str, now_ms: int) -> list[ev.Event]:
    """The coded outcome for the caller of a dropped request (none for service events).

    Ids derive from the request, so a re-run after a crash or an abort produces the same
    event (deduplicated by id downstream) instead of a second answer.
    """
    if not failure.answer:
        return []
    message = f"the request was dead-lettered: {failure.reason}"
    common: dict[str, Any] = {
        "event_id": derive_id(event.event_id, "dead-lettered", type(event).__name__),
        "invocation_id": event.invocation_id,
        "partition_key": event.partition_key,
        "causation_id": event.event_id,
        "correlation_id": event.correlation_id or event.invocation_id,
        "occurred_at": now_ms,
        "producer": producer,
    }
    if isinstance(event, ev.ToolCallProposed):
        return [
            ev.ProposalRejected(
                **common,
                code=failure.code.value,
                message=message,
                details_json=canonical_json({"dead_lettered": "true"}),
            )
        ]
    if isinstance(event, ev.ApprovalDecisionSubmitted):
        return [ev.ApprovalDecisionRejected(**common, code=failure.code.value, message=message)]
    return []


def dead_letter(
    event_id: str,
    invocation_id: str,
    partition_key: str,
    producer: str,
    now_ms: int,
    failure: Deterministic,
    source: tuple[str, int, int],
    original: bytes,
) -> ev.EventDeadLettered:
    """The dead-letter record of an input that ``handle`` could not process."""
    topic, partition, offset = source
    return ev.EventDeadLettered(
        event_id=event_id,
        invocation_id=invocation_id,
        partition_key=partition_key,
        occurred_at=now_ms,
        producer=producer,
        code=failure.code.value,
        reason=f"{producer} could not handle the input: {failure.reason}",
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        original=original,
    )
