"""The gateway's way to a decision: ask the decider that owns the request, directly.

Where the deciders are comes from ``tf.deciders`` (``streams.direct.Announcer``): each live
decider of this gateway's scheduler says there, every few seconds and at every rebalance, its
direct lane's address and the partitions of ``tf.requests`` Kafka's group gave it. A request
belongs to the partition its affinity key hashes to (as a Kafka producer would place it), so
to the decider that owns that partition: requests sharing a prefix meet the same decider, as
they do through the log. A partition nobody claims (a rebalance under way) goes to a live
decider chosen by the partition number, the same one every time.

Asking (``decide``): one connection per decider (``streams.direct.DirectConnection``). A
decider that cannot be reached, or whose connection ends before it answers, costs the call one
more attempt (``attempt`` + 1, so the first one's possible decision can never be mistaken for
the second's) on the next decider; one that was just lost is tried last for ``LOST_FOR_S``.
With no decider known, the call waits for one to be announced, up to its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from infra import metrics
from infra.kafka.clients import TopicsMissing, partition_reader
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import MAX_ATTEMPT, DeciderAnnouncement, InferenceRequest
from schemas.topics import DECIDERS, REQUESTS, key_of
from streams.direct import ANNOUNCE_EVERY_S, Answer, DeciderLost, DirectConnection

log = logging.getLogger(__name__)

SILENT_AFTER_S = 5 * ANNOUNCE_EVERY_S
"""A decider not heard from for this long is gone (it died without saying so)."""
LOST_FOR_S = 2.0
"""A decider whose connection just failed is asked last for this long."""
FORGOTTEN_AFTER_S = 60.0
"""A decider silent this long is forgotten (its connection closed)."""


class NoDecider(TimeoutError):
    """No decider could be asked before the deadline."""


@dataclass
class Asked:
    """One call's asking: the request as last asked, and the future of its answer."""

    request: InferenceRequest
    answer: asyncio.Future[Answer] | None = None


class Deciders:
    def __init__(self, connection: KafkaConnection, scheduler: str) -> None:
        self.connection = connection
        self.scheduler = scheduler  # the deciders' group this gateway's requests belong to
        self._known: dict[str, DeciderAnnouncement] = {}  # worker -> what it said last
        self._lanes: dict[str, DirectConnection] = {}  # address -> connection
        self._lost: dict[str, float] = {}  # address -> when its connection failed (monotonic)
        self._news = asyncio.Event()  # set at each announcement
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Read the announcements of the last ``SILENT_AFTER_S``, then follow new ones."""
        consumer = await self._reader()
        self._task = asyncio.get_running_loop().create_task(self._follow(consumer))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for lane in self._lanes.values():
            await lane.close()

    async def decide(self, call: Asked, deadline: float) -> Answer:
        """The final answer for ``call.request`` (placed or rejected), by monotonic ``deadline``.
        ``call`` follows the asking: ``request`` as last asked (its ``attempt`` is raised for
        each decider lost on the way) and ``answer``, the future of its answer (still pending
        when this is cancelled or times out: the caller settles it). Raises ``NoDecider`` when
        no decider could be asked in time, ``TimeoutError`` when the asked one did not answer in
        time, ``streams.direct.Refused`` if the decider refused the request."""
        while True:
            address = self._choose(call.request)
            if address is None:
                await self._news_until(deadline)
                continue
            lane = self._lanes.get(address)
            if lane is None:
                lane = self._lanes[address] = DirectConnection(address)
            try:
                call.answer = await lane.ask(call.request)
                return await asyncio.wait_for(asyncio.shield(call.answer), deadline - time.monotonic())
            except DeciderLost as exc:
                log.warning(
                    "request %s attempt %d: decider %s lost (%s)",
                    call.request.request_id, call.request.attempt, address, exc,
                )  # fmt: skip
                self._lost[address] = time.monotonic()
                metrics.gateway_deciders_lost.inc()
                if call.request.attempt >= MAX_ATTEMPT or time.monotonic() >= deadline:
                    raise NoDecider(str(exc)) from None
                call.request = call.request.model_copy(update={"attempt": call.request.attempt + 1})
                call.answer = None

    async def _news_until(self, deadline: float) -> None:
        """Wait for an announcement; ``NoDecider`` at the deadline."""
        self._news.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoDecider("no decider is known")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._news.wait(), left)

    # -- whom to ask --------------------------------------------------------------------------

    def _choose(self, request: InferenceRequest) -> str | None:
        """The address of the decider that owns ``request``'s partition (a live one, not lost
        lately); else of a live decider picked by the partition number; None if none is known."""
        now = time.time()
        live = [s for s in self._known.values() if not s.leaving and now - s.ts <= SILENT_AFTER_S]
        if not live:
            return None
        count = max(said.partition_count for said in live) or 1
        partition = int(murmur2(key_of(REQUESTS, request)) & 0x7FFFFFFF) % count
        recently_lost = time.monotonic() - LOST_FOR_S
        fine = [s for s in live if self._lost.get(s.address, 0.0) < recently_lost] or live
        owners = [s for s in fine if partition in s.partitions]
        if owners:
            return max(owners, key=lambda s: s.ts).address
        fine.sort(key=lambda s: s.worker)
        return fine[partition % len(fine)].address

    # -- following the announcements ----------------------------------------------------------

    async def _reader(self) -> object:
        return await partition_reader(
            self.connection,
            (DECIDERS,),
            SILENT_AFTER_S,
            "gateway's reader of the deciders",
            fetch_max_wait_ms=500,  # announcements come every 2 s: a slow poll costs an idle gateway less
        )

    async def _follow(self, consumer: object) -> None:
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)  # type: ignore[attr-defined]
            except KafkaError as exc:
                log.warning("gateway: reading tf.deciders failed (%s); reconnecting", exc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.stop(), 2.0)  # type: ignore[attr-defined]
                await asyncio.sleep(0.5)
                with contextlib.suppress(KafkaError, OSError, TopicsMissing):
                    consumer = await self._reader()
                continue
            for records in batches.values():
                for record in records:
                    self._heard(record.value)

    def _heard(self, value: bytes | None) -> None:
        try:
            said = decode(DeciderAnnouncement, value or b"")
        except DecodeError:
            return  # not ours to judge: the topic's writers are deciders
        if said.scheduler != self.scheduler:
            return
        known = self._known.get(said.worker)
        if known is not None and known.ts > said.ts:
            return  # an older word, read late
        self._known[said.worker] = said
        self._forget_the_gone(said.ts)
        self._news.set()

    def _forget_the_gone(self, now: float) -> None:
        """Drop the deciders silent for ``FORGOTTEN_AFTER_S`` or gone for good, and close the
        connections no live decider's address names (a restarted worker listens elsewhere)."""
        for worker, said in list(self._known.items()):
            if now - said.ts > FORGOTTEN_AFTER_S:
                del self._known[worker]
        addresses = {s.address for s in self._known.values() if not s.leaving}
        for address in [a for a in self._lanes if a not in addresses]:
            lane = self._lanes.pop(address)
            self._lost.pop(address, None)
            lane.abandon()
