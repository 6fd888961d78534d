"""Kafka over TLS and with SASL, against a real broker: the clients built from ``KafkaConnection``
and a real ``tokenfleet worker`` process.

TLS: Tansu 0.6 cannot serve TLS itself (``lab/stack/secured.py`` says why), so the broker is
the embedded Tansu behind a TLS front with a throwaway CA; every client connection, bootstrap
and advertised broker alike, is TLS with the certificate checked. SASL: Tansu with
``--authentication`` offers SCRAM only and can have no user on memory storage, so what is shown
is that our clients do log in (a refusal of the login, one line), not a successful login.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from infra.kafka.broker import (
    BrokerRefused,
    BrokerUnreachable,
    ensure_topics,
    other_schedulers,
    require_reachable,
)
from infra.kafka.clients import partition_reader, start_client
from infra.kafka.connection import KafkaConnection
from infra.kafka.request_client import RequestClient
from infra.settings import Settings
from lab.stack.processes import WorkerOptions, start_worker
from lab.stack.secured import Certificates, authenticating_broker, certificates, tls_broker
from schemas.events import AdmissionDecision, Heartbeat
from schemas.topics import TopicSpec
from tests.integration.streaming import request, unique

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_bootstrap(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with tls_broker(certs, tmp_path_factory.mktemp("tansu") / "tansu.log") as bootstrap:
        yield bootstrap


def tls_env(bootstrap: str, ca: Path | None) -> dict[str, str]:
    env = {"TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap, "TOKENFLEET_KAFKA_SECURITY_PROTOCOL": "SSL"}
    if ca is not None:
        env["TOKENFLEET_KAFKA_SSL_CAFILE"] = str(ca)
    return env


def connection_of(env: dict[str, str]) -> KafkaConnection:
    """The connection a process with ``env`` builds (the settings read as the CLI reads them)."""
    keys = {
        n.removeprefix("TOKENFLEET_").lower(): v for n, v in env.items() if n.startswith("TOKENFLEET_KAFKA_")
    }
    return KafkaConnection.from_settings(Settings(**keys))


def tokenfleet(args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_the_clients_built_from_the_connection_work_over_tls(tls_bootstrap: str, certs: Certificates) -> None:
    """Admin (topic creation, consumer groups), producer and consumer, over TLS with the CA."""
    connection = connection_of(tls_env(tls_bootstrap, certs.ca))
    assert connection.uses_tls and connection.ssl_context is not None
    require_reachable(connection)
    topic = unique("tls")
    assert ensure_topics(connection, 1, [topic]) == [topic]
    assert other_schedulers(connection, "tokenfleet-deciders") == []

    async def round_trip() -> list[bytes]:
        producer = await start_client(lambda: AIOKafkaProducer(**connection.client_options()), "tls producer")
        try:
            await producer.send_and_wait(topic, b"over tls")
        finally:
            await producer.stop()
        spec = TopicSpec(topic, Heartbeat, "instance_id")  # read raw: the type is not used
        reader = await partition_reader(connection, [spec], "beginning", "tls reader")
        try:
            batches = await reader.getmany(timeout_ms=5000)
            return [r.value for records in batches.values() for r in records]
        finally:
            await reader.stop()

    assert asyncio.run(asyncio.wait_for(round_trip(), 60)) == [b"over tls"]


def test_without_the_ca_the_broker_is_refused_in_one_line(tls_bootstrap: str, certs: Certificates) -> None:
    """The system's CAs do not know the test CA: a refusal naming the setting to fix; a client
    that speaks plaintext to the TLS port finds no broker."""
    with pytest.raises(BrokerRefused, match=r"certificate is not trusted.*TOKENFLEET_KAFKA_SSL_CAFILE"):
        require_reachable(connection_of(tls_env(tls_bootstrap, None)), timeout_s=5)
    wrong_ca = certificates(certs.ca.parent / "other", ca_name="another-ca").ca
    with pytest.raises(BrokerRefused, match="certificate is not trusted"):
        require_reachable(connection_of(tls_env(tls_bootstrap, wrong_ca)), timeout_s=5)
    with pytest.raises(BrokerUnreachable, match="no Kafka broker answers"):
        require_reachable(KafkaConnection.plaintext(tls_bootstrap), timeout_s=3)

    started = time.monotonic()
    done = tokenfleet(
        ["loadgen", "--workload", "synthetic:duration_s=1", "--fast"], tls_env(tls_bootstrap, None), 60
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the connection: TLS" in lines[0], done.stderr
    assert time.monotonic() - started < 30


def test_a_worker_decides_over_tls(tls_bootstrap: str, certs: Certificates, tmp_path: Path) -> None:
    """A real ``tokenfleet worker`` (its Faust app, request lane, group membership, shared log,
    admin) is ready over TLS and answers a request: a model it does not serve is rejected at
    once, the answer read back over TLS by a ``RequestClient``."""
    env = {**tls_env(tls_bootstrap, certs.ca), "TOKENFLEET_POOLS": '["pool-a"]'}
    options = WorkerOptions(app_id=unique("tls"), clickhouse="off", partitions=1, env=env)
    worker = start_worker(tls_bootstrap, tmp_path / "worker", options, tmp_path / "worker.log")
    try:
        worker.wait_ready(120)

        async def ask() -> object:
            async with RequestClient(connection_of(env), resend_after_s=5, give_up_after_s=60) as client:
                return await client.ask(request("not-served", unique("tls-req")))

        answer = asyncio.run(asyncio.wait_for(ask(), 90))
        assert isinstance(answer, AdmissionDecision) and answer.action == "reject", answer
        assert answer.reason.startswith("unknown_model"), answer.reason
    finally:
        worker.stop()


def test_a_worker_without_the_ca_stops_with_one_line(tls_bootstrap: str, tmp_path: Path) -> None:
    """A certificate nobody trusts is a configuration error, not a broker coming up: the worker
    exits 2 with one line instead of restarting forever."""
    env = {
        **tls_env(tls_bootstrap, None),
        "TOKENFLEET_DATA_DIR": str(tmp_path),
        "TOKENFLEET_CLICKHOUSE_DSN": "off",
    }
    done = tokenfleet(["worker"], env, 120)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tokenfleet worker: error:") and "certificate is not trusted" in last, last
    assert "Traceback" not in done.stderr


def test_the_sasl_login_reaches_the_broker(tmp_path: Path) -> None:
    """Tansu with ``--authentication`` has no user (``lab/stack/secured.py``): a SCRAM-SHA-512
    login is refused by the broker at the end of the exchange our clients start, and that is one
    line naming the settings. A client without SASL is cut off before any request."""
    with authenticating_broker(tmp_path / "tansu.log") as bootstrap:
        env = {
            "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap,
            "TOKENFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "TOKENFLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TOKENFLEET_KAFKA_SASL_USERNAME": "tokenfleet",
            "TOKENFLEET_KAFKA_SASL_PASSWORD": "not-echoed-anywhere",
        }
        with pytest.raises(
            BrokerRefused, match=r"SASL: the login was refused.*TOKENFLEET_KAFKA_SASL_MECHANISM"
        ):
            require_reachable(connection_of(env), timeout_s=5)
        with pytest.raises(BrokerUnreachable):
            require_reachable(KafkaConnection.plaintext(bootstrap), timeout_s=3)
        done = tokenfleet(["batch", "results", "job-1", "--out", str(tmp_path / "out.jsonl")], env, 60)
        assert done.returncode == 2 and "SASL: the login was refused" in done.stderr, done.stderr
        assert "not-echoed-anywhere" not in done.stderr + done.stdout
