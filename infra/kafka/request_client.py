"""A small client for Kafka producers: publish a request, await its answer, resend on silence.

    async with RequestClient(KafkaConnection.from_settings(settings)) as client:
        request = InferenceRequest(request_id="r1", model="llama3-8b", prompt="Hi", output_budget=64)
        answer = await client.ask(request)
        if isinstance(answer, Response):
            print(answer.status, answer.text)
        else:
            print("rejected:", answer.reason, "retry after", answer.retry_after_s)

The answer to a request attempt is its ``Response`` on ``tf.responses`` (the dispatcher ran it;
``status`` says how it ended) or a ``reject`` on ``tf.admission`` (the scheduler turned it away,
with a reason and maybe ``retry_after_s``). A hold (``queue``) is not an answer: the request
waits in a queue pool and is answered later.

A broker may lose what it acknowledged (a restarted single-node broker, a misconfigured
cluster), so a request with no answer ``resend_after_s`` after it was last sent is sent again,
the same event (same request id, attempt and event id), until ``give_up_after_s`` after it was
first sent: then its future fails with ``NoAnswer``. Resending is safe: the scheduler decides a
request attempt once and publishes the same decision again for a resend, and the dispatcher
runs it once and gives the same answer again; answers are collapsed by request id and attempt
(the first wins).

The client reads every partition of ``tf.responses`` and ``tf.admission`` from their end at
``start`` (outside any consumer group), so it sees the answers to what it sends after that; its
reading cost grows with the whole topics' traffic, which suits a client of moderate rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from agents.affinity import HotPrefixes
from infra.kafka.clients import LogWatch, partition_reader, send_event, start_client
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import AdmissionDecision, InferenceRequest, Response
from schemas.topics import ADMISSION, REQUESTS, RESPONSES

log = logging.getLogger(__name__)

Answer = Response | AdmissionDecision  # the Response, or the admission's reject
Key = tuple[str, int]  # (request id, attempt)


class NoAnswer(TimeoutError):
    """No answer came for a request attempt within ``give_up_after_s``, resends included."""


@dataclass(slots=True)
class _Pending:
    request: InferenceRequest
    answer: asyncio.Future[Answer]
    first_sent: float
    last_sent: float
    resends: int = 0


class RequestClient:
    """Requests out on ``tf.requests``, answers in (module docstring).

    ``send``: how a request is published (default: this client's own producer, keyed by the
    request's affinity key, as the scheduler expects); a caller with its own producer passes
    its send and uses ``track`` for what it published itself."""

    def __init__(
        self,
        connection: KafkaConnection,
        resend_after_s: float = 30.0,
        give_up_after_s: float = 300.0,
        send: Callable[[InferenceRequest], Awaitable[None]] | None = None,
        hot_prefixes: HotPrefixes | None = None,
    ) -> None:
        if not 0 < resend_after_s <= give_up_after_s:
            raise ValueError("need 0 < resend_after_s <= give_up_after_s")
        self.connection = connection
        self.resend_after_s, self.give_up_after_s = resend_after_s, give_up_after_s
        self._send = send or self._publish
        self.hot_prefixes = hot_prefixes or HotPrefixes()
        self._producer: Any = None
        self._reader: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[Key, _Pending] = {}
        self.resent = 0  # resends, in all
        self.answered = 0
        self.given_up = 0  # requests with no answer when given up on (give_up_after_s, or stop)

    async def start(self) -> None:
        """Start reading answers (from now on), and the producer if this client sends."""
        self._reader = await partition_reader(self.connection, [RESPONSES, ADMISSION], "end", "answer reader")
        if self._send == self._publish:
            self._producer = await start_client(
                lambda: AIOKafkaProducer(**self.connection.client_options(), linger_ms=2), "request client"
            )
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._resend())]

    async def stop(self) -> None:
        """Stop; requests still waiting get ``NoAnswer``."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for pending in self._pending.values():
            self.given_up += 1
            if not pending.answer.done():
                pending.answer.set_exception(NoAnswer("the client stopped before an answer came"))
        self._pending.clear()
        for client in (self._producer, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), 10.0)

    async def __aenter__(self) -> RequestClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def waiting(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    async def ask(self, request: InferenceRequest) -> Answer:
        """Send ``request`` and wait for its answer (``NoAnswer`` after ``give_up_after_s``)."""
        return await (await self.submit(request))

    async def submit(self, request: InferenceRequest) -> asyncio.Future[Answer]:
        """Send ``request`` (spread over the pool's deciders if its prefix is hot here,
        ``agents.affinity``); the future of its answer."""
        request = self.hot_prefixes.place(request, time.time())
        answer = self.track(request)
        await self._send(request)
        return answer

    def track(self, request: InferenceRequest) -> asyncio.Future[Answer]:
        """Wait for the answer to ``request``, published now by the caller (resent by ``send``)."""
        key = (request.request_id, request.attempt)
        pending = self._pending.get(key)
        if pending is None:
            now = time.monotonic()
            pending = self._pending[key] = _Pending(
                request, asyncio.get_running_loop().create_future(), now, now
            )
        return pending.answer

    async def _publish(self, request: InferenceRequest) -> None:
        await (await send_event(self._producer, REQUESTS, request))

    async def _read(self) -> None:
        watch = LogWatch(self._reader, "answer reader")  # a restarted broker: its new log is read
        while True:
            batches = await self._reader.getmany(timeout_ms=200, max_records=2000)
            for tp, records in batches.items():
                kind: type[Answer] = Response if tp.topic == RESPONSES.name else AdmissionDecision
                for record in records:
                    self._take(kind, record.value)
            await watch.check()

    def _take(self, kind: type[Answer], value: bytes | None) -> None:
        if not self._pending:
            return
        try:
            answer = decode(kind, value)
        except DecodeError:
            return  # not this client's to judge
        if isinstance(answer, AdmissionDecision) and answer.action != "reject":
            return  # admitted (its Response follows) or held
        pending = self._pending.pop((answer.request_id, answer.attempt), None)
        if pending is not None and not pending.answer.done():
            pending.answer.set_result(answer)
            self.answered += 1

    async def _resend(self) -> None:
        tick = min(1.0, self.resend_after_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for key, pending in list(self._pending.items()):
                if now - pending.first_sent >= self.give_up_after_s:
                    del self._pending[key]
                    self.given_up += 1
                    if not pending.answer.done():
                        pending.answer.set_exception(
                            NoAnswer(
                                f"no answer to {key[0]!r} (attempt {key[1]}) in {self.give_up_after_s:g} s"
                            )
                        )
                elif now - pending.last_sent >= self.resend_after_s:
                    pending.last_sent, pending.resends = now, pending.resends + 1
                    self.resent += 1
                    try:
                        await self._send(pending.request)
                    except Exception as exc:  # the broker is away: the next round tries again
                        log.warning("resending %.128r failed: %s", key[0], exc)


def _retrieved(answer: asyncio.Future[Answer]) -> None:
    if not answer.cancelled():
        answer.exception()
