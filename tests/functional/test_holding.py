"""Held requests are bounded and expire; unknown models, redeliveries and failures are answered once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agents.handlers import SchedulerAgents
from agents.policy.baselines import RoundRobin
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.pipeline import Scheduler
from agents.policy.pools import HoldLimits
from agents.policy.types import BoolArray, ClusterView, Placement, RequestView
from agents.routing import RoutingService
from schemas import topics
from tests.functional.fakes import MemoryPublisher, MemoryState, RecordingTelemetry
from tests.functional.test_agents import beat, raw, request


def agents_with(service: RoutingService) -> tuple[SchedulerAgents, MemoryPublisher]:
    publisher = MemoryPublisher()
    return SchedulerAgents(service, MemoryState(), publisher, RecordingTelemetry()), publisher


def answers(publisher: MemoryPublisher) -> list[tuple[str, str, str]]:
    return [(a.request_id, a.action, a.reason.split(":")[0]) for a in publisher.sent[topics.ADMISSION.name]]  # type: ignore[attr-defined]


def test_a_full_pool_rejects_and_a_held_request_expires_on_the_timer() -> None:
    agents, publisher = agents_with(
        RoutingService("round-robin", hold=HoldLimits(max_per_pool=2, timeout_s=0.0))
    )
    asyncio.run(agents.on_requests(raw(request("m", "a"), request("m", "b"), request("m", "c"))))
    assert answers(publisher) == [("a", "queue", "no ready instance of the model in an allowed data centre"),
                                  ("b", "queue", "no ready instance of the model in an allowed data centre"),
                                  ("c", "reject", "queue_full")]  # fmt: skip
    asyncio.run(agents.on_timer())  # no heartbeat ever comes for this pool: the timer answers
    assert answers(publisher)[3:] == [("a", "reject", "expired"), ("b", "reject", "expired")]
    assert agents.service.held("m") == 0


def test_an_unknown_model_is_rejected_at_once_not_held() -> None:
    agents, publisher = agents_with(RoutingService("round-robin", known_pools=["m"]))
    asyncio.run(agents.on_requests(raw(request("nope", "x"))))
    assert answers(publisher) == [("x", "reject", "unknown_model")]
    assert agents.service.pools() == []  # no scheduler state was made for it


def test_without_configured_pools_the_number_of_pools_is_bounded() -> None:
    agents, publisher = agents_with(RoutingService("tokenpilot", max_pools=3))
    asyncio.run(agents.on_requests(raw(*(request(f"model-{i}", f"r{i}") for i in range(10)))))
    assert [action for _, action, _ in answers(publisher)] == ["queue"] * 3 + ["reject"] * 7
    assert {reason for _, action, reason in answers(publisher) if action == "reject"} == {"unknown_model"}
    assert len(agents.service.pools()) == 3


def test_junk_model_names_never_lock_out_a_pool_that_engines_serve() -> None:
    """Three junk names fill the unserved places and expire; a real pool whose instances report
    later gets its place and routes (the oldest junk name that holds nothing is forgotten), and
    even with every unserved place holding a request a served pool is never refused."""
    agents, publisher = agents_with(
        RoutingService("round-robin", max_pools=3, hold=HoldLimits(max_per_pool=10, timeout_s=0.0))
    )
    asyncio.run(agents.on_requests(raw(*(request(f"junk-{i}", f"j{i}") for i in range(3)))))
    asyncio.run(agents.on_timer())  # the junk requests expire: their pools hold nothing now
    asyncio.run(agents.on_heartbeats(raw(beat("real", "i-1"))))
    asyncio.run(agents.on_requests(raw(*(request("real", f"r{i}") for i in range(20)))))
    real = [action for rid, action, _ in answers(publisher) if rid.startswith("r")]
    assert real == ["admit"] * 20
    assert "real" in agents.service.pools() and len(agents.service.pools()) == 3

    agents, publisher = agents_with(RoutingService("round-robin", max_pools=2))
    asyncio.run(agents.on_requests(raw(request("junk-a", "a"), request("junk-b", "b"))))  # held
    asyncio.run(agents.on_heartbeats(raw(beat("real", "i-1"))))
    asyncio.run(agents.on_requests(raw(request("real", "r"), request("junk-c", "c"))))
    assert [(rid, action) for rid, action, _ in answers(publisher)][2:] == [("r", "admit"), ("c", "reject")]


def test_a_redelivered_request_is_not_decided_again() -> None:
    agents, publisher = agents_with(RoutingService("round-robin"))
    asyncio.run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    once = request("m", "r")
    asyncio.run(agents.on_requests(raw(once)))
    asyncio.run(agents.on_requests(raw(once)))  # the lane re-read its batch
    sent = publisher.sent[topics.DECISIONS.name]
    assert [d.request_id for d in sent] == ["r", "r"]  # type: ignore[attr-defined]
    assert len({d.event_id for d in sent}) == 1  # type: ignore[attr-defined]  (one decision, sent again)


class Explodes(RoundRobin):
    """A router that cannot place requests named boom-* (a stand-in for any per-request bug)."""

    def place(
        self, requests: Sequence[RequestView], masks: Sequence[BoolArray], view: ClusterView, now_s: float
    ) -> list[Placement]:
        if any(r.request_id.startswith("boom") for r in requests):
            raise ValueError("cannot place this one")
        return super().place(requests, masks, view, now_s)


def test_a_request_that_cannot_be_scheduled_is_dead_lettered_alone() -> None:
    def make(_pool: str) -> Scheduler:
        return Scheduler("explodes", PassThrough(), HomeDc(), Explodes())

    agents, publisher = agents_with(RoutingService("round-robin", make_scheduler=make))
    asyncio.run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    delivered: Any = asyncio.run(
        agents.on_requests(raw(request("m", "a"), request("m", "boom"), request("m", "b")))
    )
    assert delivered is not None
    assert [d.request_id for d in publisher.sent[topics.DECISIONS.name]] == ["a", "b"]  # type: ignore[attr-defined]
    (dead,) = publisher.sent[topics.DLQ.name]
    assert dead.source_topic == topics.REQUESTS.name and "cannot place this one" in dead.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["tokenpilot", "local-only+tokenpilot", "global-least-load+tokenpilot"])
def test_a_pinned_model_version_is_never_substituted(policy: str) -> None:
    """Every DC stage honours the request's model_version: a request for version 999 is held
    while only version 1 runs, and expires unanswered by any instance; version 1 is routed."""
    agents, publisher = agents_with(RoutingService(policy, hold=HoldLimits(max_per_pool=10, timeout_s=0.0)))
    asyncio.run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    asyncio.run(agents.on_requests(raw(request("m", "v999", model_version="999", home_dc="dc-1"))))
    asyncio.run(agents.on_requests(raw(request("m", "v1", model_version="1", home_dc="dc-1"))))
    asyncio.run(agents.on_timer())
    assert [(rid, action) for rid, action, _ in answers(publisher)] == [
        ("v999", "queue"), ("v1", "admit"), ("v999", "reject")
    ]  # fmt: skip
    routed = publisher.sent[topics.DECISIONS.name]
    assert [d.request_id for d in routed] == ["v1"]  # type: ignore[attr-defined]
