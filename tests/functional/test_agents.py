"""The scheduler's stream handlers with the routing service, driven through injected fakes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents.handlers import SchedulerAgents
from agents.keeping import LogKeeper
from agents.policy.pools import DEFERRED_POOL
from agents.routing import RoutingService
from schemas import topics
from schemas.codec import encode
from schemas.events import (
    AdmissionDecision,
    BatchJob,
    Completion,
    DeadLetter,
    Heartbeat,
    InferenceRequest,
    ResponseStarted,
    RoutingDecision,
)
from tests.functional.fakes import MemoryPublisher, MemoryState, RecordingTelemetry


def beat(pool: str, instance: str) -> Heartbeat:
    return Heartbeat(
        instance_id=instance, dc="dc-1", model=pool, model_version="1", profile="llama3-8b-h100",
        waiting=0, running=0, tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=1000,
    )  # fmt: skip


def request(pool: str, rid: str, **kwargs: Any) -> InferenceRequest:
    return InferenceRequest(request_id=rid, model=pool, input_tokens=600, output_budget=16, **kwargs)


def raw(*events: Any) -> list[tuple[bytes | None, bytes | None]]:
    return [(b"k", e if isinstance(e, bytes) else encode(e)) for e in events]


@pytest.fixture
def world() -> tuple[SchedulerAgents, MemoryPublisher, RecordingTelemetry]:
    publisher, telemetry = MemoryPublisher(), RecordingTelemetry()
    agents = SchedulerAgents(
        RoutingService("tokenpilot", log_delay_s=0.005), MemoryState(), publisher, telemetry
    )
    return agents, publisher, telemetry


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_held_request_is_routed_by_the_first_heartbeat_alone(world: Any) -> None:
    agents, publisher, telemetry = world
    run(agents.on_requests(raw(request("m", "early"))))
    (held,) = publisher.sent[topics.ADMISSION.name]
    assert isinstance(held, AdmissionDecision) and (held.action, held.queue_pool) == ("queue", "no_capacity")
    assert telemetry.depth == {"m": 1} and not publisher.sent[topics.DECISIONS.name]
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))  # no further request arrives
    (routed,) = publisher.sent[topics.DECISIONS.name]
    assert isinstance(routed, RoutingDecision) and (routed.request_id, routed.instance_id) == ("early", "i-1")
    assert routed.predicted_ttft_s is not None and routed.policy == "tokenpilot"
    assert [a.action for a in publisher.sent[topics.ADMISSION.name]] == ["queue", "admit"]  # type: ignore[attr-defined]
    assert telemetry.depth == {"m": 0}
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))  # nothing held: nothing more
    assert len(publisher.sent[topics.DECISIONS.name]) == 1


def test_a_request_sent_twice_is_decided_once(world: Any) -> None:
    agents, publisher, _ = world
    twice = request("m", "dup")
    run(agents.on_requests(raw(twice, twice)))  # twice in one batch, before any capacity
    run(agents.on_requests(raw(twice)))  # and redelivered while held
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    assert [a.action for a in publisher.sent[topics.ADMISSION.name]] == ["queue", "admit"]  # type: ignore[attr-defined]
    assert [d.request_id for d in publisher.sent[topics.DECISIONS.name]] == ["dup"]  # type: ignore[attr-defined]


def test_a_request_resent_after_its_decision_gets_the_same_decision_again(world: Any) -> None:
    """A client resends a request whose answer it never got (a broker lost it): the decision
    it had is published again with the same event ids, not decided a second time."""
    agents, publisher, _ = world
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    resent = request("m", "r")
    run(agents.on_requests(raw(resent)))
    run(agents.on_requests(raw(resent)))
    admissions, decisions = publisher.sent[topics.ADMISSION.name], publisher.sent[topics.DECISIONS.name]
    assert [a.event_id for a in admissions] == [admissions[0].event_id] * 2  # type: ignore[attr-defined]
    assert [d.event_id for d in decisions] == [decisions[0].event_id] * 2  # type: ignore[attr-defined]
    assert decisions[1].request == decisions[0].request  # type: ignore[attr-defined]
    assert agents.service.scheduler_for("m").instance_selection.in_flight.requests == {"i-1": 1}  # type: ignore[attr-defined]


def test_bad_messages_are_dead_lettered_once_and_the_batch_goes_on(world: Any) -> None:
    """A bad request is dead-lettered by the decider that reads it; a bad heartbeat, which every
    decider reads, only by the log's keeper of its partition (else once per decider)."""
    agents, publisher, telemetry = world
    keeper = LogKeeper(publisher, telemetry)
    run(agents.on_heartbeats(raw(beat("m", "i-1"), b"{not json")))
    assert not publisher.sent[topics.DLQ.name]
    run(keeper.keep_heartbeats(raw(beat("m", "i-1"), b"{not json")))
    run(agents.on_requests(raw(request("m", "a"), b'{"request_id": "x"}', request("m", "b"))))
    dead = publisher.sent[topics.DLQ.name]
    assert [d.source_topic for d in dead] == [topics.HEARTBEATS.name, topics.REQUESTS.name]  # type: ignore[attr-defined]
    assert all(isinstance(d, DeadLetter) and d.reason for d in dead)
    assert [d.request_id for d in publisher.sent[topics.DECISIONS.name]] == ["a", "b"]  # type: ignore[attr-defined]
    assert telemetry.dead == [topics.HEARTBEATS.name, topics.REQUESTS.name]


def test_a_decider_counts_the_other_deciders_placements_as_its_own(world: Any) -> None:
    """Two deciders of one pool: what one places reaches the other through ``tf.decisions``;
    the other counts it in flight until its completion, never decides that request again (a
    redelivery or a resend gets that same decision published again), and skips its own
    placements read back from the log."""
    agents, publisher, telemetry = world
    service = RoutingService("tokenpilot", worker="other:1")
    other = SchedulerAgents(service, MemoryState(), MemoryPublisher(), telemetry)
    for decider in (agents, other):
        run(decider.on_heartbeats(raw(beat("m", "i-1"))))
    run(other.on_requests(raw(request("m", "a"))))
    placed = other.publisher.sent[topics.DECISIONS.name]
    run(agents.on_decisions(raw(*placed)))
    run(other.on_decisions(raw(*placed)))  # its own: skipped
    assert telemetry.observed == {"m": 1}
    for decider in (agents, other):
        pilot = decider.service.scheduler_for("m").instance_selection
        assert pilot.in_flight.requests == {"i-1": 1}
    run(agents.on_requests(raw(request("m", "a"))))  # redelivered (or resent) to the first decider
    again = publisher.sent[topics.DECISIONS.name]
    assert [(d.event_id, d.instance_id, d.worker) for d in again] == [
        (d.event_id, d.instance_id, d.worker) for d in placed
    ]  # type: ignore[attr-defined]
    assert again[0].request.request_id == "a"  # type: ignore[attr-defined]
    assert not publisher.sent[topics.ADMISSION.name]  # the other's admission was not read here
    lanes = [d.service.scheduler_for("m").instance_selection.lane for d in (agents, other)]  # type: ignore[attr-defined]
    assert lanes == [(0, 2), (0, 1)]  # the first read the other's placement: it knows of two
    assert agents.service.scheduler_for("m").instance_selection.in_flight.requests == {"i-1": 1}  # type: ignore[attr-defined]
    done = Completion(
        request_id="a", instance_id="i-1", model="m", status="ok", arrival_ts=1.0, ttft_s=0.05,
        input_tokens=600, output_tokens=16,
    )  # fmt: skip
    run(agents.on_completions(raw(done)))
    assert agents.service.scheduler_for("m").instance_selection.in_flight.requests == {"i-1": 0}  # type: ignore[attr-defined]


def test_a_slomax_decider_counts_the_other_deciders_holds_and_skips_its_own() -> None:
    """The other decider's new hold, read from ``tf.admission``, reaches this decider's SLOMax
    (its long-prompt gates then see interactive work waiting in the pool); its own holds read
    back and the admits and rejects on the topic are skipped; TokenPilot alone reads none."""
    deciders = [
        SchedulerAgents(
            RoutingService("slomax+tokenpilot", worker=w),
            MemoryState(),
            MemoryPublisher(),
            RecordingTelemetry(),
        )
        for w in ("a:1", "b:1")
    ]
    first, other = deciders
    assert first.service.wants_holds and not RoutingService("tokenpilot").wants_holds
    run(other.on_requests(raw(request("m", "x"))))  # no instance yet: x is held
    run(first.on_requests(raw(request("m", "own"))))
    (held,) = other.publisher.sent[topics.ADMISSION.name]
    assert held.action == "queue"  # type: ignore[attr-defined]
    run(first.on_admissions(raw(held, *first.publisher.sent[topics.ADMISSION.name])))
    admission = first.service.scheduler_for("m").admission
    assert set(admission.waiting.elsewhere) == {("x", 1)}  # type: ignore[attr-defined]
    # Its size and its decider's lane (b:1 after a:1) come with it: a:1 offers before b:1 and
    # leaves room for b:1's older holds.
    there = admission.waiting.elsewhere[("x", 1)]  # type: ignore[attr-defined]
    assert held.worker == "b:1" and there.input_tokens == held.input_tokens > 0  # type: ignore[attr-defined]
    waiting = admission.waiting  # type: ignore[attr-defined]
    assert there.lane == 1 and waiting.behind(0, there.time_s) == [(there.time_s, there.input_tokens)]
    run(other.on_heartbeats(raw(beat("m", "i-1"))))  # x is placed, and admitted on the log
    answers = other.publisher.sent[topics.ADMISSION.name][1:]
    assert [a.action for a in answers] == ["admit"]  # type: ignore[attr-defined]
    run(first.on_admissions(raw(*answers)))
    run(first.on_decisions(raw(*other.publisher.sent[topics.DECISIONS.name])))
    assert not admission.waiting.elsewhere  # type: ignore[attr-defined]


def test_with_another_decider_a_short_prompt_is_decided_a_few_milliseconds_later(world: Any) -> None:
    """A decider that knows of another, with TokenPilot deciding bursts largest first (its cache
    empty), decides a long-context request at once and defers a short one by its lane's log
    delays (``Scheduler.next_wake_s``); a timer decides it then, with no heartbeat or request
    after it."""
    agents, publisher, _ = world
    service = RoutingService("tokenpilot", worker="b:1")
    other = SchedulerAgents(service, MemoryState(), MemoryPublisher(), RecordingTelemetry())

    async def scenario() -> None:
        for decider in (agents, other):
            await decider.on_heartbeats(raw(beat("m", "i-1"), beat("m", "i-2")))
        await other.on_requests(raw(request("m", "s")))
        await agents.on_decisions(raw(*other.publisher.sent[topics.DECISIONS.name]))  # two deciders now
        await agents.on_requests(raw(request("m", "long", slo_class="long_context"), request("m", "short")))
        held = [a for a in publisher.sent[topics.ADMISSION.name] if a.action == "queue"]  # type: ignore[attr-defined]
        assert [(a.request_id, a.queue_pool) for a in held] == [("short", DEFERRED_POOL)]  # type: ignore[attr-defined]
        assert [d.request_id for d in publisher.sent[topics.DECISIONS.name]] == ["long"]  # type: ignore[attr-defined]
        await asyncio.sleep(0.1)
        assert [d.request_id for d in publisher.sent[topics.DECISIONS.name]] == ["long", "short"]  # type: ignore[attr-defined]

    run(scenario())


def test_residency_narrows_the_data_centres(world: Any) -> None:
    agents, publisher, _ = world
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    run(agents.on_requests(raw(request("m", "eu-only", allowed_regions=("eu-west",)))))
    (admission,) = publisher.sent[topics.ADMISSION.name]
    assert admission.action == "queue" and not publisher.sent[topics.DECISIONS.name]  # type: ignore[attr-defined]


def test_first_tokens_and_completions_reach_the_scheduler(world: Any) -> None:
    agents, _, _ = world
    run(agents.on_heartbeats(raw(beat("m", "i-1"))))
    run(agents.on_requests(raw(request("m", "a"))))
    scheduler = agents.service.scheduler_for("m")
    pilot = scheduler.instance_selection
    assert pilot.in_flight.requests == {"i-1": 1}  # type: ignore[attr-defined]
    started = ResponseStarted(request_id="a", instance_id="i-1", model="m", ttft_s=0.05)
    done = Completion(
        request_id="a", instance_id="i-1", model="m", status="ok", arrival_ts=1.0, ttft_s=0.05,
        input_tokens=600, output_tokens=16,
    )  # fmt: skip
    run(agents.on_first_tokens(raw(started)))
    run(agents.on_completions(raw(done)))
    assert pilot.in_flight.requests == {"i-1": 0}  # type: ignore[attr-defined]


def test_a_batch_job_becomes_deadline_requests(world: Any) -> None:
    agents, publisher, _ = world
    job = BatchJob(job_id="j", deadline_s=60, requests=(request("m", "x"), request("m", "y")))
    run(agents.on_batch_jobs(raw(job)))
    expanded = publisher.sent[topics.REQUESTS.name]
    assert [r.request_id for r in expanded] == ["j/x", "j/y"]  # type: ignore[attr-defined]
    assert all(r.slo_class == "batch" and r.deadline_ts == job.ts + 60 for r in expanded)  # type: ignore[attr-defined]
