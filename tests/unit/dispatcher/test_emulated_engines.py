"""The engine port over the emulated engines: what the dispatcher sees, with wall times passed in."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from dispatcher.engines.emulated import EmulatedEngines
from dispatcher.engines.port import Endpoint, EngineError, EngineEvent, EnginePort
from schemas.events import Completion, KvEvent, Response, ResponseStarted, RoutingDecision
from tests.unit.sim.helpers import routing_decision

START = 1_000.0
T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def engines_of(n: int = 2) -> EnginePort:
    return EmulatedEngines.from_spec(f"{n}xllama3-8b-h100", start_wall=START)


def decision(rid: str, **kwargs: Any) -> RoutingDecision:
    return routing_decision(rid, **{"instance": "i000", "at": START, **kwargs})


async def drain(engines: EnginePort, until: float) -> list[EngineEvent]:
    """Sleep through the engines' wakeups (as the dispatcher does) up to ``until``."""
    now, seen = START, []
    while (wake := engines.next_wakeup(now)) is not None and wake <= until:
        now = wake
        seen.extend(await engines.events(now))
    seen.extend(await engines.events(until))
    return seen


def test_endpoints_describe_the_fleet() -> None:
    assert engines_of(2).endpoints == (
        Endpoint("i000", "dc-1", "llama3-8b", "1", "llama3-8b-h100"),
        Endpoint("i001", "dc-1", "llama3-8b", "1", "llama3-8b-h100"),
    )
    with pytest.raises(ValueError, match="bad fleet group"):
        EmulatedEngines.from_spec("three llamas")


def test_a_dispatched_request_streams_a_first_token_then_completes() -> None:
    async def scenario() -> list[EngineEvent]:
        engines = engines_of()
        assert await engines.dispatch(decision("a", input_tokens=1500, output_tokens=30), START) is True
        assert engines.open_requests == 1
        events = await drain(engines, START + 30)
        assert engines.open_requests == 0 and engines.next_wakeup(START + 30) is None
        assert await engines.events(START + 31) == []  # each event is returned once
        return events

    events = run(scenario())
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    replies = [e for e in events if not isinstance(e, KvEvent)]
    assert [type(e) for e in replies] == [ResponseStarted, Response, Completion]
    started, answer, done = replies
    assert isinstance(started, ResponseStarted) and isinstance(done, Completion)
    assert (done.request_id, done.instance_id, done.status, done.output_tokens) == ("a", "i000", "ok", 30)
    assert isinstance(answer, Response)  # the answer, without text: the emulation makes no tokens
    assert (answer.request_id, answer.status, answer.completion_tokens, answer.text) == ("a", "ok", 30, "")
    assert started.ttft_s == pytest.approx(done.ttft_s) and started.ts < done.ts
    assert [e.block_hashes for e in events if isinstance(e, KvEvent)] == [(1, 2)]


def test_a_redelivered_decision_is_not_dispatched_twice() -> None:
    async def scenario() -> list[EngineEvent]:
        engines = engines_of()
        once = decision("a")
        assert await engines.dispatch(once, START) is True
        assert await engines.dispatch(once, START + 0.01) is False
        assert engines.open_requests == 1
        return await drain(engines, START + 30)

    assert [c.request_id for c in run(scenario()) if isinstance(c, Completion)] == ["a"]


def test_a_request_that_cannot_run_is_reported_as_an_error_completion() -> None:
    async def scenario() -> list[EngineEvent]:
        engines = engines_of()
        assert await engines.dispatch(decision("lost", instance="nowhere"), START) is True
        assert engines.open_requests == 0 and engines.next_wakeup(START) is None
        return await engines.events(START)

    answer, lost = run(scenario())
    assert isinstance(lost, Completion) and (lost.request_id, lost.status) == ("lost", "error")
    assert isinstance(answer, Response) and (answer.request_id, answer.status) == ("lost", "error")


def test_abort_ends_a_waiting_and_a_running_attempt_and_nothing_else() -> None:
    async def scenario() -> list[EngineEvent]:
        engines = engines_of(1)
        await engines.dispatch(decision("running", input_tokens=60_000, slo_class="long_context"), START)
        await engines.dispatch(decision("waiting", at=START + 0.01), START + 0.01)
        assert await engines.abort("waiting", 1, START + 0.02) is True
        assert await engines.abort("running", 1, START + 0.02) is True
        assert await engines.abort("running", 1, START + 0.03) is False  # already ending
        assert await engines.abort("never-sent", 1, START + 0.03) is False
        events = await drain(engines, START + 30)
        assert engines.open_requests == 0
        return events

    events = run(scenario())
    ended = {c.request_id: c for c in events if isinstance(c, Completion)}
    assert {rid: c.status for rid, c in ended.items()} == {"waiting": "aborted", "running": "aborted"}
    assert ended["waiting"].ts == pytest.approx(START + 0.02)  # at once
    assert START + 0.02 <= ended["running"].ts < START + 1.0  # at the end of its step in progress
    assert not any(isinstance(e, ResponseStarted) for e in events)


def test_load_is_one_heartbeat_per_endpoint_in_order() -> None:
    async def scenario() -> None:
        engines = engines_of(2)
        await engines.dispatch(decision("a", input_tokens=4000), START)
        busy, idle = await engines.load(START + 0.001)
        assert [busy.instance_id, idle.instance_id] == [e.instance_id for e in engines.endpoints]
        assert busy.waiting + busy.running == 1 and busy.tokens_in_flight >= 4000
        assert 0 < busy.kv_blocks_used < busy.kv_blocks_total and busy.endpoint_ready
        assert (idle.waiting, idle.running, idle.kv_blocks_used) == (0, 0, 0)
        assert busy.ts == START + 0.001 and busy.model_version == "1"

    run(scenario())


def test_a_closed_engine_refuses_every_call() -> None:
    async def scenario() -> None:
        engines = engines_of()
        await engines.close()
        await engines.close()  # idempotent
        with pytest.raises(EngineError):
            await engines.dispatch(decision("a"), START)
        with pytest.raises(EngineError):
            await engines.events(START)
        with pytest.raises(EngineError):
            engines.next_wakeup(START)

    run(scenario())
