"""Which Kafka a process talks to: the configured one, or an embedded Tansu broker of its own.

Every deployable and every command that needs the bus opens it here (``kafka_connection``), so
each is built from the same settings the same way: its addresses, TLS and SASL, or, with no
``TOKENFLEET_KAFKA_BOOTSTRAP``, a broker started on loopback for as long as the block runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from infra.kafka.broker import embedded_broker
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings


@contextlib.contextmanager
def kafka_connection(settings: Settings) -> Iterator[KafkaConnection]:
    """The configured Kafka (its addresses, TLS and SASL: every client of the process is built
    from this one object), or an embedded Tansu broker, plaintext, for the duration of the
    block. ``ValueError`` (one line) when a TLS file cannot be used."""
    if settings.kafka_bootstrap:
        yield KafkaConnection.from_settings(settings)
        return
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with embedded_broker(log_path=settings.data_dir / "tansu.log") as bootstrap:
        yield KafkaConnection.from_settings(settings, bootstrap)
