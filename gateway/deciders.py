"""The gateway's way to a decision: ask the decider that owns the request, directly.

Where the deciders are comes from ``tf.deciders`` (``streams.direct.Announcer``): each live
decider of this gateway's scheduler says there, every few seconds and at every rebalance, its
direct lane's address and the partitions of ``tf.requests`` Kafka's group gave it. A request
belongs to the partition its affinity key hashes to (as a Kafka producer would place it), so
to the decider that owns that partition: requests sharing a prefix meet the same decider, as
they do through the log. A partition nobody claims (a rebalance under way) goes to a live
decider chosen by the partition number, the same one every time.

Asking (``decide``): one connection per decider (``streams.direct.DirectConnection``). A call
waits for a decision until its deadline, whatever happens to the deciders on the way:

- a decider whose connection ends after the request was sent costs the call one more attempt
  (``attempt`` + 1, so the first one's possible decision can never be mistaken for the
  second's), asked of the next decider; one that cannot be reached costs nothing (nothing was
  sent) and is asked again;
- a decider that failed is *unavailable* for a back-off that grows with each failure of its
  episode (``BACKOFF_FIRST_S`` x 2^(tries-1), at most ``BACKOFF_MAX_S``, jittered x0.5-1):
  calls go to another live decider meanwhile, or wait for the back-off to end or for a new
  announcement (a restarted worker says where it listens now); an episode (first failure ->
  the decider reached again) logs one warning and one line when it ends, not one per try;
- with no decider known, the call waits for one to be announced.

At the deadline: ``NoDecider`` with the truth (which decider, unreachable since when, or none
known); the gateway answers 503 with ``Retry-After``.

Following (``start``): a reader of ``tf.deciders`` outside any group. A log that starts again (a
restarted in-memory broker) is read again from its start at once (``infra.kafka.clients.
LogWatch``), so the restarted deciders' announcements are heard within one poll. ``ready``: the
reader's fetches are answered and a live decider is known that has not failed since it last
announced itself: the gateway can get decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass

from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from infra import metrics
from infra.kafka.clients import LogWatch, TopicsMissing, partition_reader
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import MAX_ATTEMPT, DeciderAnnouncement, InferenceRequest
from schemas.topics import DECIDERS, REQUESTS, key_of
from streams.direct import ANNOUNCE_EVERY_S, Answer, DeciderLost, DirectConnection

log = logging.getLogger(__name__)

SILENT_AFTER_S = 5 * ANNOUNCE_EVERY_S
"""A decider not heard from for this long is gone (it died without saying so)."""
BACKOFF_FIRST_S = 0.1
"""A decider that just failed is not asked again for about this long (doubling per failure)."""
BACKOFF_MAX_S = 2.0
"""The longest back-off: a worker restarted by its supervisor is asked within this of listening."""
FORGOTTEN_AFTER_S = 60.0
"""A decider silent this long is forgotten (its connection closed)."""
READER_STALE_S = 5.0
"""The reader of ``tf.deciders`` is not ready when no fetch of its was answered for this long."""


class NoDecider(TimeoutError):
    """No decider could be asked before the deadline (the message says why)."""


@dataclass
class _Unavailable:
    """One decider's episode of failures: from the first to the moment it is reached again."""

    since: float  # monotonic: the episode's first failure
    why: str  # the last failure
    tries: int = 0
    until: float = 0.0  # monotonic: not asked again before (the back-off)
    failed_at: float = 0.0  # wall clock: the last failure (an announcement after it: back again)

    def failed(self, why: str, now: float) -> None:
        self.tries += 1
        self.why = why
        self.failed_at = time.time()
        backoff = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** (self.tries - 1))
        self.until = now + backoff * random.uniform(0.5, 1.0)


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
        self._unavailable: dict[str, _Unavailable] = {}  # address -> its episode of failures
        self._news = asyncio.Event()  # set at each announcement
        self._task: asyncio.Task[None] | None = None
        self._watch: LogWatch | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def ready(self) -> bool:
        """Decisions can be had: the reader follows ``tf.deciders`` (a fetch answered within
        ``READER_STALE_S``) and a live decider is known that did not fail since it last
        announced itself (a decider that cannot be reached is no way to a decision)."""
        if self._watch is None or not self._watch.fresh(READER_STALE_S):
            return False
        return any(self._announced_since_failing(said) for said in self._live())

    def _announced_since_failing(self, said: DeciderAnnouncement) -> bool:
        episode = self._unavailable.get(said.address)
        return episode is None or said.ts > episode.failed_at

    def status(self) -> dict[str, object]:
        """What ``/ready`` shows: the reader's state and the deciders known, live and unavailable."""
        now = time.monotonic()
        return {
            "reader": "running" if self.running else "stopped",
            "reader_fresh": self._watch is not None and self._watch.fresh(READER_STALE_S),
            "deciders_live": len(self._live()),
            "deciders_reachable": sum(map(self._announced_since_failing, self._live())),
            "deciders_unavailable": {
                address: {"for_s": round(now - u.since, 1), "tries": u.tries, "why": u.why[:200]}
                for address, u in self._unavailable.items()
            },
        }

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
        each decider lost with the request in its hands) and ``answer``, the future of its
        answer (still pending when this is cancelled or times out: the caller settles it).
        Raises ``NoDecider`` when no decider could be asked in time, ``TimeoutError`` when the
        asked one did not answer in time, ``streams.direct.Refused`` if the decider refused
        the request."""
        while True:
            if time.monotonic() >= deadline:
                raise NoDecider(self._why_none())
            address, wait_until = self._choose(call.request)
            if address is None:
                await self._news_until(min(deadline, wait_until))
                continue
            lane = self._lanes.get(address)
            if lane is None:
                lane = self._lanes[address] = DirectConnection(address)
            try:
                call.answer = await lane.ask(call.request)
            except DeciderLost as exc:  # not reached: nothing was sent, the attempt stands
                self._failed(address, str(exc))
                continue
            self._reached(address)
            try:
                return await asyncio.wait_for(asyncio.shield(call.answer), deadline - time.monotonic())
            except DeciderLost as exc:
                self._failed(address, str(exc))
                log.debug(
                    "request %s attempt %d: decider %s lost with it",
                    call.request.request_id,
                    call.request.attempt,
                    address,
                )
                if call.request.attempt >= MAX_ATTEMPT:
                    raise NoDecider(str(exc)) from None
                call.request = call.request.model_copy(update={"attempt": call.request.attempt + 1})
                call.answer = None

    async def _news_until(self, until: float) -> None:
        """Wait for an announcement, at most until monotonic ``until``."""
        self._news.clear()
        left = until - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), left)

    def _failed(self, address: str, why: str) -> None:
        now = time.monotonic()
        episode = self._unavailable.get(address)
        if episode is None:
            episode = self._unavailable[address] = _Unavailable(since=now, why=why)
            metrics.gateway_deciders_lost.inc()
            log.warning(
                "gateway: decider %s failed (%s); its calls wait for it or go to another decider",
                address,
                why,
            )
        episode.failed(why, now)

    def _reached(self, address: str) -> None:
        self._end_episode(address, "reached again")

    def _end_episode(self, address: str, how: str) -> None:
        episode = self._unavailable.pop(address, None)
        if episode is not None:
            log.warning(
                "gateway: decider %s %s after %.1f s unavailable (%d failed tries)",
                address, how, time.monotonic() - episode.since, episode.tries,
            )  # fmt: skip

    def _why_none(self) -> str:
        """Why no decider could be asked, for the caller's 503."""
        if not self._unavailable:
            return "no decider is known (none announced itself on tf.deciders)"
        now = time.monotonic()
        address, episode = min(self._unavailable.items(), key=lambda item: item[1].since)
        since = now - episode.since
        return f"decider {address} unreachable for {since:.1f} s ({episode.tries} tries): {episode.why}"

    # -- whom to ask --------------------------------------------------------------------------

    def _live(self) -> list[DeciderAnnouncement]:
        now = time.time()
        return [s for s in self._known.values() if not s.leaving and now - s.ts <= SILENT_AFTER_S]

    def _choose(self, request: InferenceRequest) -> tuple[str | None, float]:
        """The address of the decider that owns ``request``'s partition, if it is available
        (not in a back-off); else of an available live decider picked by the partition number;
        else ``None`` and when the first back-off ends (``inf``: none known)."""
        live = self._live()
        now = time.monotonic()
        waits = {
            s.address: self._unavailable[s.address].until for s in live if s.address in self._unavailable
        }
        available = [s for s in live if waits.get(s.address, 0.0) <= now]
        if not available:
            return None, min(waits.values(), default=float("inf"))
        count = max(said.partition_count for said in live) or 1
        partition = int(murmur2(key_of(REQUESTS, request)) & 0x7FFFFFFF) % count
        owners = [s for s in available if partition in s.partitions]
        if owners:
            return max(owners, key=lambda s: s.ts).address, now
        available.sort(key=lambda s: s.worker)
        return available[partition % len(available)].address, now

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
        """Read ``consumer`` until cancelled (``close``), replacing it when the broker fails it;
        the one it holds last is stopped on the way out, whatever ends the loop."""
        self._watch = LogWatch(consumer, "gateway's reader of the deciders")
        try:
            while True:
                try:
                    batches = await consumer.getmany(timeout_ms=500, max_records=1000)  # type: ignore[attr-defined]
                    await self._watch.check()
                except KafkaError as exc:
                    log.warning("gateway: reading tf.deciders failed (%s); reconnecting", exc)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(consumer.stop(), 2.0)  # type: ignore[attr-defined]
                    await asyncio.sleep(0.5)
                    with contextlib.suppress(KafkaError, OSError, TopicsMissing):
                        consumer = await self._reader()
                        self._watch = LogWatch(consumer, "gateway's reader of the deciders")
                    continue
                for records in batches.values():
                    for record in records:
                        self._heard(record.value)
        finally:
            with contextlib.suppress(Exception):  # (stopping a stopped consumer does nothing)
                await asyncio.wait_for(consumer.stop(), 2.0)  # type: ignore[attr-defined]

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
        episode = self._unavailable.get(said.address)
        if episode is not None and said.ts > episode.failed_at:
            episode.until = 0.0  # it says it listens since it failed: worth asking again now
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
            self._end_episode(address, "is no longer announced (its worker listens elsewhere or left)")
            lane.abandon()
