"""Integration fixtures: one real embedded Kafka broker (Tansu) for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.kafka.broker import embedded_broker, ensure_topics


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap ``host:port`` of a Tansu broker with the project's topics (4 partitions)."""
    log = Path(tmp_path_factory.mktemp("broker")) / "tansu.log"
    with embedded_broker(log_path=log) as bootstrap:
        ensure_topics(bootstrap, partitions=4)
        yield bootstrap
