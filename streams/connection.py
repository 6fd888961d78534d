"""What the stream clients need to reach the broker, as an interface (``streams`` may not import
the adapters): ``infra.kafka.connection.KafkaConnection`` is the one implementation, built from
the settings by ``infra.kafka.bus.kafka_connection``. Every consumer, producer and the Faust
app here is built from it, so none can miss the TLS and SASL settings."""

from __future__ import annotations

from typing import Any, Protocol


class BrokerConnection(Protocol):
    def client_options(self) -> dict[str, Any]:
        """``bootstrap_servers`` and the security keyword arguments of any aiokafka client."""
        ...

    def faust_broker(self) -> str:
        """The Faust app's ``broker`` URL(s)."""
        ...

    def faust_credentials(self) -> Any:
        """The Faust app's ``broker_credentials`` (``None`` for plaintext)."""
        ...
