"""Integration fixtures: one real embedded Kafka broker (Tansu) for the session, and a migrated
embedded ClickHouse store (chdb) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from lab.stack import broker as lab_broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap ``host:port`` of a Tansu broker with the project's topics (4 partitions)."""
    log = Path(tmp_path_factory.mktemp("broker")) / "tansu.log"
    with lab_broker(partitions=4, log_path=log) as bootstrap:
        yield bootstrap


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    """An open client on a migrated store in the test's own data dir."""
    # The engine serves one data dir per process: close before the next test opens its own.
    with connect(f"chdb:///{tmp_path / 'clickhouse'}") as opened:
        migrate(opened)
        yield opened


from tests.integration.vllm_servers import vllm_pair  # noqa: E402, F401  (two real vLLM servers, session-wide)
