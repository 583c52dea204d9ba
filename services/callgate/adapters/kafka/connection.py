"""How every Kafka client of this process reaches the brokers: TLS, SASL and socket settings.

The ``kafka_client`` setting (docs/configuration.md) holds librdkafka properties that every
producer, consumer and admin client gets, so one table in ``callgate.toml`` secures the
decider, the executor, the projections, the HTTP server's readers and the command line
alike. Only connection properties are accepted: the delivery, isolation, commit and
transaction settings are callgate's own (they carry C8, C9 and C12), and a configuration
that tried to change them (``isolation.level``, ``enable.auto.commit``, ``acks`` …) is
refused at start, naming the key.

The composition root (``callgate.bootstrap.bootstrap``) calls ``use_connection`` once per
process, before any client is made; ``client.client_config`` merges the result. This module
imports no Kafka client, so the configuration can check the keys without loading librdkafka.
"""

from __future__ import annotations

from collections.abc import Mapping

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

_connection: dict[str, Property] = {}


def check_connection(properties: Mapping[str, object]) -> None:
    """Raise ``ValueError`` naming every key that ``kafka_client`` may not set (the
    ``Settings`` validator calls this, so what reaches ``use_connection`` is checked)."""
    if refused := sorted(k for k in properties if not k.startswith(CONNECTION_PREFIXES)):
        raise ValueError(
            f"{', '.join(refused)}: not a connection property; kafka_client takes only "
            "security.protocol, ssl.*, sasl.*, client.id, socket.* and the like (callgate "
            "sets delivery, isolation, commit and transaction settings itself)"
        )


def use_connection(properties: Mapping[str, Property]) -> None:
    """Every client made from now on in this process gets ``properties``."""
    _connection.clear()
    _connection.update(properties)


def connection() -> dict[str, Property]:
    """The connection properties in force (a copy)."""
    return dict(_connection)
