"""What an adapter needs from the composition root, as a port.

Backends, supervisors and runners receive the settings, the clock and the processes as an
argument of this shape; ``callgate.bootstrap.App`` is the one implementation. Adapters never
import the composition root, so the dependency runs one way: the root wires adapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.runner import EmbeddedRunner
    from callgate.adapters.embedded.store import EmbeddedStore
    from callgate.adapters.kafka.runner import KafkaRunner
    from callgate.domain.keys import KeyRing
    from callgate.domain.process_port import Process
    from callgate.settings import Clock, Settings
    from callgate.tracing import Tracing


class Wiring(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def keys(self) -> KeyRing:
        """The key material (created on first use: processes started later share it)."""
        ...

    @property
    def tracing(self) -> Tracing | None:
        """Spans of invocations (ADR 0036); ``None`` when tracing is off."""
        ...

    def processes(self) -> list[Process[Any]]:
        """Every process ``callgate serve`` runs, in pipeline order."""
        ...

    def projections(self) -> list[Process[Any]]: ...

    def embedded_runner(
        self, store: EmbeddedStore, codec: AvroCodec, **options: Any
    ) -> EmbeddedRunner:
        """The runner over every process on the embedded store (built by the root alone)."""
        ...

    def kafka_runner(self, process: Process[Any], **options: Any) -> KafkaRunner:
        """The runner of one process on Kafka (built by the root alone)."""
        ...
