"""Who still claims a partition the group handed over (``streams.handoff.claimants``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from schemas.events import DeciderAnnouncement, Event
from streams.direct import Announcer
from streams.handoff import Claim, claimants

GROUP = "app-deciders"
NOW = 1_000.0


def _claim(
    worker: str,
    partitions: tuple[int, ...],
    age_s: float = 1.0,
    scheduler: str = GROUP,
    leaving: bool = False,
) -> Claim:
    announcement = DeciderAnnouncement(
        worker=worker, scheduler=scheduler, address="127.0.0.1:1", partitions=partitions, leaving=leaving
    )
    return NOW - age_s, announcement


def test_a_live_decider_that_still_reads_the_partition_holds_it() -> None:
    latest = {
        "a:1": _claim("a:1", (0, 1, 2)),
        "b:2": _claim("b:2", (3,), leaving=True),  # stopping, its lane still deciding
    }
    assert claimants(latest, {2, 3}, GROUP, "me:9", NOW, 6.0) == {"a:1": {2}, "b:2": {3}}


def test_what_does_not_hold_a_partition() -> None:
    latest = {
        "me:9": _claim("me:9", (2,)),  # this decider's own claim
        "a:1": _claim("a:1", (0, 1)),  # it let go of 2 (its newest announcement)
        "b:2": _claim("b:2", (), leaving=True),  # it stopped: its lane let go
        "c:3": _claim("c:3", (2,), age_s=6.5),  # silent longer than the session: gone
        "d:4": _claim("d:4", (2,), scheduler="other-deciders"),  # another app's deciders
    }
    assert claimants(latest, {2}, GROUP, "me:9", NOW, 6.0) == {}


def test_a_stopping_decider_claims_its_partitions_until_its_lane_let_go() -> None:
    sent: list[DeciderAnnouncement] = []

    async def send(spec: object, events: Sequence[Event]) -> Awaitable[object]:
        sent.extend(e for e in events if isinstance(e, DeciderAnnouncement))
        return asyncio.sleep(0)

    async def partition_count() -> int:
        return 4

    async def scenario() -> None:
        announcer = Announcer(send, "me:9", GROUP, lambda: "127.0.0.1:1", lambda: {1, 3}, partition_count)
        await announcer.start()
        await asyncio.sleep(0.05)
        await announcer.leave()  # gateways stop asking; the lane still decides 1 and 3
        await announcer.stop()  # the lane stopped: 1 and 3 are free

    asyncio.run(scenario())
    assert [(a.leaving, a.partitions) for a in sent] == [(False, (1, 3)), (True, (1, 3)), (True, ())]
    latest = {"me:9": (NOW, sent[1])}
    assert claimants(latest, {1}, GROUP, "other:1", NOW, 6.0) == {"me:9": {1}}
    latest = {"me:9": (NOW, sent[2])}
    assert claimants(latest, {1}, GROUP, "other:1", NOW, 6.0) == {}
