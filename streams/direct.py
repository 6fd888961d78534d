"""The direct lane: a gateway asks the decider that owns a request and gets the decision in the
time the decision takes, not in two trips over the broker.

Why: through the log a gateway's call waits for the request to reach the broker, the decider's
fetch, the decision to reach the broker and the gateway's fetch: two broker round trips
(docs/results/real-engines.md), and every gateway reads every decision. Here the gateway keeps one
TCP connection per decider (as Envoy's ext-proc keeps one to llm-d's endpoint picker); the
decider decides at once with the same stages and state as for the log's requests, answers on
the connection, and publishes the request (``decided_by`` set: no request lane decides it
again) and its decisions to the log, which stays the record every other decider, the store and
a replay read. The log's copy is published as the answer leaves, not before: a decider killed
in those few milliseconds leaves the call answered and run once, and its record incomplete.

Wire, one line each way (a word, a space, JSON, ``\\n``):

- gateway -> decider: ``decide <InferenceRequest>`` (counts and block hashes, no prompt);
- decider -> gateway, once the answer is final (a held request's when a heartbeat makes room
  or its hold expires), in any order: ``routing <RoutingDecision>`` (run it there),
  ``reject <AdmissionDecision>``, or ``refused {"request_id", "attempt", "error"}`` (the
  request is not valid; also dead-lettered).

A connection that closes withdraws its requests still held: nobody waits for them any more
(their gateway asks another decider, as the next attempt). Whoever can reach the port can ask
for decisions: keep it inside the cluster (the deployment's NetworkPolicy does).

Where deciders are: each announces its address and the partitions of ``tf.requests`` Kafka's
group gave it on ``tf.deciders`` (``Announcer``): at every assignment, every
``ANNOUNCE_EVERY_S`` while it lives, and as it leaves. The group decides who owns what; the
announcements only tell the gateways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

from agents.handlers import DirectKey, Refused
from schemas import topics
from schemas.codec import DecodeError, decode, encode
from schemas.events import AdmissionDecision, DeciderAnnouncement, Event, InferenceRequest, RoutingDecision

log = logging.getLogger(__name__)

ANNOUNCE_EVERY_S = 2.0
"""How often a live decider says where it is; a gateway forgets one silent for 5 times that."""
MAX_LINE_BYTES = 1 << 20  # a request without its prompt: block hashes of up to ~MAX_TOKENS tokens


class DirectDecider(Protocol):
    """What the lane needs from the scheduler's agents (``agents.handlers.SchedulerAgents``)."""

    async def on_direct(self, value: bytes) -> tuple[DirectKey, asyncio.Future[Event]]:
        """Decide a request asked for directly; its key and a future of its final answer (a
        ``RoutingDecision`` or a rejecting ``AdmissionDecision``). Raises ``Refused``."""
        ...

    def on_direct_gone(self, key: DirectKey) -> None:
        """Nobody waits for ``key``'s answer any more: stop holding it."""


class DirectLane:
    """The decider's side: a TCP server on ``host``:``port`` (0 = any free port), reachable by
    gateways at ``advertised_host`` (default: ``host``, or this machine's name for 0.0.0.0)."""

    def __init__(self, decider: DirectDecider, host: str, port: int, advertised_host: str = "") -> None:
        self.decider = decider
        self.host, self.port = host, port
        wildcard = host in ("0.0.0.0", "::")
        self.advertised_host = advertised_host or (socket.gethostname() if wildcard else host)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        """host:port where gateways reach this lane (after ``start``)."""
        return f"{self.advertised_host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_LINE_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("direct lane listening on %s:%d (announced as %s)", self.host, self.port, self.address)

    async def stop(self) -> None:
        """Stop listening and close every connection: their gateways ask another decider now."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One gateway's connection: decide each line, answer each when final; on close, let go
        of what is still held for it."""
        waiting: dict[DirectKey, asyncio.Future[Event]] = {}
        self._connections.add(writer)
        _no_delay(writer)

        def reply(key: DirectKey, answer: asyncio.Future[Event]) -> None:
            waiting.pop(key, None)
            if answer.cancelled() or writer.is_closing():
                return
            event = answer.result()
            kind = b"routing" if isinstance(event, RoutingDecision) else b"reject"
            writer.write(kind + b" " + encode(event) + b"\n")

        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, ConnectionError):  # a line beyond MAX_LINE_BYTES, a reset
                    break
                if not line:
                    break
                word, _, body = line.partition(b" ")
                try:
                    if word != b"decide":
                        raise Refused("", 0, f"unknown command {word[:32]!r}; this lane takes 'decide'")
                    key, answer = await self.decider.on_direct(body)
                except Refused as refused:
                    writer.write(b"refused " + _refusal(refused) + b"\n")
                    continue
                if answer.done():  # decided at once: answer now, before anything else runs
                    reply(key, answer)
                    continue
                waiting[key] = answer
                answer.add_done_callback(lambda done, key=key: reply(key, done))  # type: ignore[misc]
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        finally:
            self._connections.discard(writer)
            for key, answer in list(waiting.items()):
                if not answer.done():
                    answer.cancel()
                    self.decider.on_direct_gone(key)
            writer.close()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """Each line is a whole call or answer: send it now, not after Nagle's wait for an ACK
    (which a delayed ACK on the other side can stretch to 40 ms)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _refusal(refused: Refused) -> bytes:
    body = {"request_id": refused.request_id, "attempt": refused.attempt, "error": str(refused)[:1024]}
    return json.dumps(body).encode()


Send = Callable[[topics.TopicSpec, list[Event]], Awaitable[Awaitable[object]]]


class Announcer:
    """Says on ``tf.deciders`` where this decider is and which partitions it owns (``partitions``:
    those its request lane reads; ``streams.handoff`` relies on a lost one being announced gone
    only after the lane let go of it): now, at every change (``changed``), every
    ``ANNOUNCE_EVERY_S``, and ``leaving`` as it stops (``leave``, then ``stop``)."""

    def __init__(
        self,
        send: Send,
        worker: str,
        scheduler: str,
        address: Callable[[], str],
        partitions: Callable[[], set[int]],
        partition_count: Callable[[], Awaitable[int]],
    ) -> None:
        self.send, self.worker, self.scheduler = send, worker, scheduler
        self.address, self.partitions, self.partition_count = address, partitions, partition_count
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def changed(self) -> None:
        self._changed.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def leave(self) -> None:
        """Stop announcing and say ``leaving`` (gateways ask the others from now on), still
        claiming the partitions the lane reads: it may still be deciding their requests."""
        await self._cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._announce(leaving=True, claimed=self.partitions()), 2.0)

    async def stop(self) -> None:
        """Say ``leaving``, claiming nothing: call it once the lane let go of its partitions
        (their next owners wait for this: ``streams.handoff``)."""
        await self._cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._announce(leaving=True), 2.0)

    async def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._announce()
            except Exception as exc:  # the broker is away: the next round says it again
                log.warning("direct lane: announcing failed: %s", exc)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), ANNOUNCE_EVERY_S)

    async def _announce(self, leaving: bool = False, claimed: set[int] | None = None) -> None:
        """``claimed``: the partitions said (default: the lane's, or none when ``leaving``)."""
        if claimed is None:
            claimed = set() if leaving else self.partitions()
        event = DeciderAnnouncement(
            worker=self.worker,
            scheduler=self.scheduler,
            address=self.address(),
            partitions=tuple(sorted(claimed)),
            partition_count=await self.partition_count(),
            leaving=leaving,
        )
        await (await self.send(topics.DECIDERS, [event]))


Answer = RoutingDecision | AdmissionDecision
"""A final answer: where to run the request, or the admission stage's reject."""


Key = tuple[str, int]  # (request id, attempt)
Future = asyncio.Future[Answer]


class DeciderLost(ConnectionError):
    """The decider's connection failed or closed before it answered."""


class DirectConnection:
    """The gateway's side of one decider's direct lane: one TCP connection, any number of
    calls on it at once (answers come in any order, matched by request id and attempt)."""

    def __init__(self, address: str, connect_timeout_s: float = 1.0) -> None:
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[Key, Future] = {}
        self._connecting: asyncio.Lock | None = None

    @property
    def open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def ask(self, request: InferenceRequest) -> asyncio.Future[Answer]:
        """Send ``request`` to the decider; a future of its final answer, which fails with
        ``DeciderLost`` if the connection ends first or ``Refused`` if the decider refuses it.
        Raises ``DeciderLost`` at once if the decider cannot be reached."""
        writer = await self._connected()
        key = (request.request_id, request.attempt)
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[key] = answer
        writer.write(b"decide " + encode(request) + b"\n")
        return answer

    def abandon(self) -> None:
        """Close the connection now; the calls waiting on it fail with ``DeciderLost``."""
        if self._reader_task is not None:
            self._reader_task.cancel()

    async def close(self) -> None:
        """``abandon``, and wait until the connection is closed."""
        self.abandon()
        if self._reader_task is not None:
            with contextlib.suppress(BaseException):
                await self._reader_task

    async def _connected(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            host, _, port = self.address.rpartition(":")
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port), limit=MAX_LINE_BYTES), self.connect_timeout_s
                )
            except (OSError, TimeoutError, ValueError) as exc:
                raise DeciderLost(f"cannot reach the decider at {self.address}: {exc}") from None
            _no_delay(writer)
            self._writer, self._pending = writer, {}
            self._reader_task = asyncio.create_task(self._read(reader, writer, self._pending))
            return writer

    async def _read(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pending: dict[Key, Future]
    ) -> None:
        """Hand each answer of one connection to its caller; when the connection ends, fail the
        calls still waiting on it (``DeciderLost``: their gateway asks another decider)."""
        why = "the decider closed the connection"
        try:
            while line := await reader.readline():
                _take(line, pending, self.address)
        except (ConnectionError, ValueError) as exc:
            why = f"the connection to the decider failed: {exc}"
        except asyncio.CancelledError:
            why = "the gateway closed the connection"
            raise
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in pending.values():
                if not future.done():
                    future.set_exception(DeciderLost(f"{self.address}: {why}"))
            pending.clear()


def _take(line: bytes, pending: dict[Key, Future], address: str) -> None:
    """One answer line: complete its caller's future."""
    word, _, body = line.partition(b" ")
    try:
        if word == b"routing":
            answer: Answer = decode(RoutingDecision, body)
        elif word == b"reject":
            answer = decode(AdmissionDecision, body)
        elif word == b"refused":
            fields = json.loads(body)
            future = pending.pop((str(fields["request_id"]), int(fields["attempt"])), None)
            if future is not None and not future.done():
                future.set_exception(Refused(fields["request_id"], fields["attempt"], fields["error"]))
            return
        else:
            raise DecodeError(f"unknown answer {word[:32]!r}")
    except (DecodeError, ValueError, KeyError, TypeError) as exc:
        log.error("direct lane %s: an answer that does not read: %s", address, exc)
        return
    future = pending.pop((answer.request_id, answer.attempt), None)
    if future is not None and not future.done():
        future.set_result(answer)
