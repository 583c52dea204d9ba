"""How every Kafka client of this process reaches the brokers: TLS, SASL and socket settings.

The ``kafka_client`` setting (docs/configuration.md) holds librdkafka properties that every
producer, consumer and admin client gets, so one table in ``callgate.toml`` secures the
decider, the executor, the projections, the HTTP server's readers and the command line
alike. Only connection properties are accepted: the delivery, isolation, commit and
transaction settings are callgate's own (they carry C8, C9 and C12), and a configuration
that tried to change them (``isolation.level``, ``enable.auto.commit``, ``acks`` …) is
refused at start, naming the key.

The properties travel with the servers as one value, ``Brokers``, passed explicitly to every
client (``client.client_config`` merges them): no module-global connection, so two clients
in one process can reach two differently secured clusters. This module imports no Kafka
client, so the configuration can check the keys without loading librdkafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Property = str | int | float | bool

# librdkafka properties (CONFIGURATION.md) that say how to connect and authenticate, and
# nothing about what is delivered, read or committed.
CONNECTION_PREFIXES = (
    "security.protocol",
    "ssl.",
    "ssl_engine.",
    "enable.ssl.certificate.verification",
    "sasl.",
    "client.id",
    "client.rack",
    "client.dns.lookup",
    "socket.",
    "broker.address.",
    "connections.max.idle.ms",
    "reconnect.backoff.",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "api.version.request.timeout.ms",
    "https.",
)


def check_connection(properties: Mapping[str, object]) -> None:
    """Raise ``ValueError`` naming every key that ``kafka_client`` may not set (the
    ``Settings`` validator calls this, so what reaches ``use_connection`` is checked)."""
    if refused := sorted(k for k in properties if not k.startswith(CONNECTION_PREFIXES)):
        raise ValueError(
            f"{', '.join(refused)}: not a connection property; kafka_client takes only "
            "security.protocol, ssl.*, sasl.*, client.id, socket.* and the like (callgate "
            "sets delivery, isolation, commit and transaction settings itself)"
        )


@dataclass(frozen=True)
class Brokers:
    """Where the brokers are and how to connect to them: the servers and the connection
    properties (TLS, SASL, socket) every client made for them gets. ``str()`` is the
    servers, so messages naming the brokers read the same as a plain address."""

    servers: str
    properties: Mapping[str, Property] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.servers


# A client's brokers: a ``Brokers``, or a plain address (no connection properties).
BrokerAddress = str | Brokers


def servers_of(brokers: BrokerAddress) -> str:
    return brokers.servers if isinstance(brokers, Brokers) else brokers


def properties_of(brokers: BrokerAddress) -> dict[str, Property]:
    return dict(brokers.properties) if isinstance(brokers, Brokers) else {}
