"""The hand-off of a partition of ``tf.requests`` between deciders: the new owner starts deciding
its requests only once the old one has stopped.

Why: Kafka's group gives a partition to its new owner at the same moment the old owner learns
it lost it, and the old owner stops only after the batch it is deciding and the delivery of
every decision in flight (``RequestLane.follow``). On a busy machine that takes a second or
more; a new owner that started at once read the requests after the old owner's last commit and
decided again those the old owner was still deciding: two decisions for one (request id,
attempt). A fixed grace is a guess about the old owner's speed; this is a fence.

The fence is the deciders' own announcements on ``tf.deciders`` (``streams.direct.Announcer``):
a decider announces the partitions its request lane reads, at once when they change (after it
let go of what it lost: its last decisions are on the broker by then), every
``ANNOUNCE_EVERY_S`` while it lives, and, as it stops, ``leaving`` first with the partitions it
still reads, then with none once its lane stopped. ``Handoff.released(partitions)`` reads the announcements of
the last ``stale_after_s`` and returns once no *other* decider of the same deciders' group
claims any of ``partitions`` in its latest announcement. A claim does not count when:

- it is the decider's own (``me``), or of another group (another app on the same topics);
- it is older than ``stale_after_s`` (the group's session timeout): a live decider renews its
  claim every ``ANNOUNCE_EVERY_S``, far more often, so an older claim is a decider that died
  (killed: the group gave its partitions away only after its session timed out, so its last
  claim is at least that old by then, and the fence costs a takeover nothing).

It waits at most ``limit_s`` in all (a decider that keeps claiming a partition it lost is
stuck; the new owner then goes on, with a warning), and never fails: a broker that cannot be
read leaves the new owner to go on as before the fence (a warning says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.codec import DecodeError, decode
from schemas.events import DeciderAnnouncement
from streams.clients import stop_client
from streams.connection import BrokerConnection

log = logging.getLogger(__name__)

Claim = tuple[float, DeciderAnnouncement]
"""An announcement and when it was written (its record's timestamp, seconds)."""


def claimants(
    latest: Mapping[str, Claim],
    partitions: Iterable[int],
    group: str,
    me: str,
    now: float,
    stale_after_s: float,
) -> dict[str, set[int]]:
    """Which other live deciders of ``group`` still claim which of ``partitions``, from each
    decider's ``latest`` announcement (worker -> claim; module docstring: what does not count)."""
    wanted = set(partitions)
    out: dict[str, set[int]] = {}
    for worker, (at, announcement) in latest.items():
        if worker == me or announcement.scheduler != group:
            continue
        if now - at > stale_after_s:
            continue
        claimed = wanted & set(announcement.partitions)
        if claimed:
            out[worker] = claimed
    return out


class Handoff:
    def __init__(
        self,
        connection: BrokerConnection,
        topic: str,
        group: str,
        me: str,
        *,
        stale_after_s: float,
        limit_s: float | None = None,
        fetch_max_wait_ms: int = 50,
    ) -> None:
        """``topic``: the announcements (``tf.deciders``); ``group``: the deciders' group whose
        announcements count; ``me``: this decider's ``worker`` label (its own claims never
        hold it up); ``limit_s``: the longest wait (default twice ``stale_after_s``)."""
        self.topic, self.group, self.me = topic, group, me
        self.stale_after_s = stale_after_s
        self.limit_s = 2 * stale_after_s if limit_s is None else limit_s
        self._options = {
            **connection.client_options(),
            "enable_auto_commit": False,
            "fetch_max_wait_ms": fetch_max_wait_ms,
        }

    async def released(self, partitions: set[int]) -> None:
        """Return once no other live decider claims any of ``partitions`` (module docstring)."""
        started = time.monotonic()
        try:
            waited_for = await asyncio.wait_for(self._wait(partitions), self.limit_s)
        except TimeoutError:
            log.warning(
                "hand-off: partitions %s still claimed by another decider after %.0f s; taking them over",
                sorted(partitions),
                self.limit_s,
            )
            return
        except Exception as exc:  # the fence is a safeguard: never a reason to stop deciding
            log.warning("hand-off: announcements unreadable (%r); taking partitions %s over", exc, partitions)
            return
        if waited_for:
            log.info(
                "hand-off: partitions %s released by %s after %.2f s",
                sorted(partitions),
                ", ".join(sorted(waited_for)),
                time.monotonic() - started,
            )

    async def _wait(self, partitions: set[int]) -> set[str]:
        """Read the announcements until no other decider claims ``partitions``; returns the
        deciders it waited for."""
        consumer: Any = AIOKafkaConsumer(**self._options)
        await consumer.start()
        try:
            await consumer.topics()  # fresh metadata
            tps = [
                TopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic) or ())
            ]
            if not tps:
                return set()  # nobody ever announced: nothing to wait for
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            since_ms = int((time.time() - self.stale_after_s - 1.0) * 1000)
            starts = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
            for tp in tps:
                found = starts.get(tp)
                consumer.seek(tp, ends[tp] if found is None else found.offset)
            latest: dict[str, Claim] = {}
            waited_for: set[str] = set()
            caught_up = False
            while True:
                batch = await consumer.getmany(timeout_ms=100, max_records=10_000)
                for records in batch.values():
                    for record in records:
                        with contextlib.suppress(DecodeError):
                            announcement = decode(DeciderAnnouncement, record.value)
                            at = record.timestamp / 1000
                            if announcement.worker not in latest or latest[announcement.worker][0] <= at:
                                latest[announcement.worker] = (at, announcement)
                if not caught_up:  # judged only on everything announced before the wait began
                    positions = [await consumer.position(tp) for tp in tps]
                    caught_up = all(at >= ends[tp] for at, tp in zip(positions, tps, strict=True))
                    if not caught_up:
                        continue
                holding = claimants(latest, partitions, self.group, self.me, time.time(), self.stale_after_s)
                if not holding:
                    return waited_for
                if not waited_for:
                    log.info(
                        "hand-off: waiting for %s to let go of partitions %s",
                        ", ".join(f"{w} {sorted(p)}" for w, p in sorted(holding.items())),
                        sorted(partitions),
                    )
                waited_for |= set(holding)
        finally:
            await stop_client(consumer)
