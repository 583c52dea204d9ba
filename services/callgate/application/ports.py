"""The ports of the application: the ``Backend`` a client publishes to and reads from,
and the ``Ports`` of the composition root the use cases read."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from callgate.adapters.wiring import Wiring
from callgate.domain import events as ev

if TYPE_CHECKING:
    from callgate.domain.catalog import Profile
    from callgate.domain.identity import SessionIssuer, SessionVerifier
    from callgate.providers.channels import Channels
    from callgate.providers.ledger import EffectLedger
    from callgate.providers.registry import ProviderRegistry


class Backend(Protocol):
    """What the SDK needs from a backend: publish requests, follow them, read views, wait."""

    def publish(self, events: Sequence[ev.Event]) -> None: ...

    def follow(
        self,
        request: ev.Event,
        view: str,
        key: str,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """Publish ``request`` and return the value ``view`` holds at ``key`` once ``done``
        (the last value seen at the timeout; ``None`` if none). Its cost does not grow with
        history: Kafka reads the request's own partition from where it was written."""
        ...

    def view(self, view: str, key: str) -> dict[str, Any] | None: ...

    def partition_key_of(self, invocation_id: str) -> str | None:
        """The partition key of a known invocation (approve/deny publish with it)."""
        ...

    def view_items(self, view: str) -> list[tuple[str, dict[str, Any]]]: ...

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        """The view as stored: key and canonical JSON value (replay compares bytes)."""
        ...

    def read_events(
        self, only: type[ev.Event] | tuple[type[ev.Event], ...] | None = None
    ) -> Iterator[ev.Event]:
        """The authoritative ``events`` log from the start, in log order per partition
        (``only``: just the events of that class or classes, the others skipped undecoded)."""
        ...

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class Ports(Wiring, Protocol):
    """What the use cases need from the composition root (``callgate.bootstrap.App``)
    beyond the wiring: the profile, the session verifier and issuer, the effect ledger and
    the providers."""

    @property
    def profile(self) -> Profile: ...
    @property
    def session_verifier(self) -> SessionVerifier: ...
    @property
    def session_issuer(self) -> SessionIssuer: ...
    @property
    def ledger(self) -> EffectLedger: ...
    @property
    def providers(self) -> ProviderRegistry: ...
    @property
    def channels(self) -> Channels:
        """This process's channels to agents waiting for their calls (ADR 0075)."""
        ...
