"""The SDK backend over the embedded store.

With no ``callgate serve`` running, the client itself takes the runner lock and runs
the deciders in-process until its call settles (docs/contract.md "Command line"); with a
server running, it only appends requests and polls the views.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.embedded.full_disk import retry_delay
from callgate.adapters.embedded.ownership import held_elsewhere
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.adapters.following import follow_view
from callgate.domain.codes import Code, Rejection, storage_failure
from callgate.domain.events import Event

if TYPE_CHECKING:
    # Imported when first built: a client of a running server never runs the processes.
    from callgate.adapters.embedded.runner import EmbeddedRunner
    from callgate.tracing import Tracing


# How often a client of a running server looks at the view it waits on (``wait``).
FIRST_POLL_S = 0.005
FIRST_POLLS_FOR_S = 0.5
POLL_S = 0.02


class EmbeddedBackend:
    """The client's backend on one state directory's store. ``runner`` makes the runner
    this client runs when no server holds the lock (made on first need: a client of a
    running server never builds the processes); ``tracing``: spans, or None."""

    def __init__(
        self,
        store: EmbeddedStore,
        codec: AvroCodec,
        runner: Callable[[], EmbeddedRunner],
        tracing: Tracing | None = None,
    ) -> None:
        self.codec = codec
        self.store = store
        self._make_runner = runner
        self._tracing = tracing
        # One thread of this process runs the runner at a time; another one waits as it
        # would for a server (the runner lock is the process's, not the thread's: a second
        # thread running it would release it under the first).
        self._running = threading.Lock()

    @cached_property
    def runner(self) -> EmbeddedRunner:
        """Built the first time this client may run the processes itself: not while a
        server holds the lock (``_served``), so a client of one never loads them."""
        return self._make_runner()

    def _served(self) -> bool:
        """Another runner holds the lock and this client has not built its own: wait for
        it as for a server. Once built, the runner's own ``try_acquire`` decides."""
        return "runner" not in self.__dict__ and held_elsewhere(self.store.state_dir)

    def publish(self, events: Sequence[Event]) -> None:
        """Append ``events``; traced, with the current span's context (the proposal's).
        ``storage_unavailable`` when the disk refuses the write: nothing was appended (the
        transaction is atomic), so the caller may send the same request again (ADR 0084)."""
        tracing = self._tracing
        try:
            self.store.append(events, None if tracing is None else tracing.current())
        except Exception as exc:
            reason = storage_failure(exc)
            if reason is None:
                raise
            raise Rejection(
                Code.STORAGE_UNAVAILABLE,
                f"the state directory's disk refused the write ({reason}); nothing was "
                "recorded: send it again once the disk has space",
            ) from None

    def view(self, view: str, key: str) -> dict[str, Any] | None:
        raw = self.store.view(view, key)
        return None if raw is None else _obj(raw)

    def partition_key_of(self, invocation_id: str) -> str | None:
        """From the status view: an indexed lookup, consistent with the log it was folded from."""
        status = self.view("status", invocation_id)
        return None if status is None else str(status["partition_key"])

    def follow(
        self,
        request: Event,
        view: str,
        key: str,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """Append ``request`` and run (or wait for a server) until the view value is done:
        each check is one indexed lookup, whatever the history."""
        return follow_view(self, request, view, key, done, timeout_s)

    def view_items(self, view: str) -> list[tuple[str, dict[str, Any]]]:
        return [(k, _obj(v)) for k, v in self.store.view_items(view)]

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        return self.store.view_items(view)

    def read_events(
        self, only: type[Event] | tuple[type[Event], ...] | None = None
    ) -> Iterator[Event]:
        after = 0
        classes = (only,) if isinstance(only, type) else only
        kind = None if classes is None else tuple(c.__name__ for c in classes)
        while rows := self.store.read_log("events", after_seq=after, limit=5000, event_type=kind):
            for row in rows:
                try:
                    event = self.codec.decode(row.payload)
                except MalformedEvent:
                    continue  # poison: the runner dead-lettered it and no process saw it
                if row.topic == type(event).TOPIC:  # else dead-lettered as misplaced, too
                    yield event
            after = rows[-1].seq

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Run the processes here until ``predicate`` holds, or wait for the server that
        runs them. A round the disk refuses is tried again after a growing pause, as
        ``serve`` does (ADR 0084): what was appended is recorded and stays undecided
        (``pending_decision`` at the timeout) until the disk takes writes again."""
        started = time.monotonic()
        deadline = started + timeout_s
        refused = 0
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                if not self._served() and self._running.acquire(blocking=False):
                    try:
                        if self.runner.try_acquire():
                            try:
                                return self.runner.run_until(predicate, remaining)
                            finally:
                                self.runner.release()
                    finally:
                        self._running.release()
            except Exception as exc:
                if storage_failure(exc) is None:
                    raise
                refused += 1
                time.sleep(min(retry_delay(refused), max(0.0, deadline - time.monotonic())))
                continue
            # A server, or another thread here, is doing the work: looked at every 5 ms
            # while an answer is likeliest (a call is decided within a few of the server's
            # rounds), then every 20 ms. Each look is one indexed read.
            waited = time.monotonic() - started
            time.sleep(FIRST_POLL_S if waited < FIRST_POLLS_FOR_S else POLL_S)
        return True

    def close(self) -> None:
        if "runner" in self.__dict__:  # never built: nothing to release
            self.runner.release()
        self.store.close()


def _obj(raw: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value
