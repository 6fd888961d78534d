"""The live fleet: the simulator's engines driven by wall-clock times passed in (no clock reads)."""

from __future__ import annotations

import pytest

from schemas.events import Completion, InferenceRequest, KvEvent, RoutingDecision
from sim.loop.live import LiveFleet
from tests.sim.helpers import fleet_of

START = 1_000.0


def decision(
    rid: str,
    input_tokens: int = 1000,
    output_tokens: int = 50,
    instance: str = "i0",
    slo_class: str = "interactive",
    at: float = START,
    deadline_ts: float | None = None,
) -> RoutingDecision:
    request = InferenceRequest(
        ts=at,
        request_id=rid,
        model="llama3-8b",
        prompt_block_hashes=tuple(range(1, input_tokens // 512 + 1)),
        input_tokens=input_tokens,
        output_budget=2048,
        slo_class=slo_class,
        deadline_ts=deadline_ts,
        true_output_tokens=output_tokens,
    )
    return RoutingDecision(
        ts=at,
        request_id=rid,
        model="llama3-8b",
        slo_class=slo_class,
        dc="dc-1",
        instance_id=instance,
        policy="test",
        decision_latency_s=0.0,
        request=request,
    )


def completions(events: list[Completion | KvEvent]) -> list[Completion]:
    return [e for e in events if isinstance(e, Completion)]


def test_a_decision_completes_once_with_its_true_output_length() -> None:
    fleet = LiveFleet(fleet_of(2), start_wall=START)
    fleet.submit(decision("a", input_tokens=1500, output_tokens=37), START)
    assert completions(fleet.advance(START + 0.001)) == []
    wake = fleet.next_wakeup(START + 0.001)
    assert wake is not None and wake > START + 0.001
    events = fleet.advance(START + 30)
    [done] = completions(events)
    assert (done.request_id, done.instance_id, done.status) == ("a", "i0", "ok")
    assert done.output_tokens == 37 and done.input_tokens == 1500
    assert done.ttft_s is not None and done.tpot_s is not None and done.e2e_s is not None
    assert 0 < done.ttft_s < done.e2e_s < 1.0
    assert done.arrival_ts == START and START < done.ts < START + 1.0
    stored = [e for e in events if isinstance(e, KvEvent)]
    assert [e.kind for e in stored] == ["stored"] and stored[0].block_hashes == (1, 2)
    assert fleet.advance(START + 60) == [] and fleet.next_wakeup(START + 60) is None
    assert fleet.open_attempts == 0


def test_heartbeats_reflect_the_queued_work() -> None:
    fleet = LiveFleet(fleet_of(2), start_wall=START)
    for rid in "abc":
        fleet.submit(decision(rid, input_tokens=4000), START)
    beats = {b.instance_id: b for b in fleet.heartbeats(START)}
    busy, idle = beats["i0"], beats["i1"]
    assert busy.waiting + busy.running == 3 and busy.tokens_in_flight >= 3 * 4000
    assert busy.kv_blocks_used > 0 and busy.kv_blocks_total > busy.kv_blocks_used
    assert (idle.waiting, idle.running, idle.tokens_in_flight) == (0, 0, 0)
    assert busy.model == "llama3-8b" and busy.profile == "llama3-8b-h100" and busy.ts == START
    fleet.advance(START + 60)
    drained = {b.instance_id: b for b in fleet.heartbeats(START + 60)}["i0"]
    assert (drained.waiting, drained.running, drained.tokens_in_flight) == (0, 0, 0)


def test_an_interactive_request_behind_a_huge_prefill_times_out() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("huge", input_tokens=200_000, output_tokens=4, slo_class="long_context"), START)
    fleet.submit(decision("chat", at=START + 0.5), START + 0.5)
    assert completions(fleet.advance(START + 10.4)) == []
    # Admitted behind the prompt's chunks, it is aborted at the end of the step in progress.
    [gave_up] = completions(fleet.advance(START + 13))
    assert (gave_up.request_id, gave_up.status, gave_up.output_tokens, gave_up.ttft_s) == (
        "chat",
        "timeout",
        0,
        None,
    )
    assert gave_up.e2e_s is not None and 10 <= gave_up.e2e_s < 12.5
    [huge] = completions(fleet.advance(START + 59))
    assert huge.request_id == "huge" and huge.status == "ok" and huge.ttft_s is not None and huge.ttft_s > 10


def test_a_batch_request_is_aborted_at_its_deadline_even_mid_stream() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("b", output_tokens=2000, slo_class="batch", deadline_ts=START + 2.0), START)
    [late] = completions(fleet.advance(START + 100))
    assert late.status == "timeout" and 0 < late.output_tokens < 2000 and late.ttft_s is not None
    assert late.e2e_s == pytest.approx(2.0, abs=0.05) and late.deadline_ts == START + 2.0


def test_unknown_instance_or_an_already_expired_request_is_reported_not_run() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("lost", instance="nowhere"), START)
    fleet.submit(decision("stale", at=START - 30), START)
    statuses = {c.request_id: c.status for c in completions(fleet.advance(START))}
    assert statuses == {"lost": "error", "stale": "timeout"}
    assert fleet.next_wakeup(START) is None and fleet.open_attempts == 0


def test_speed_scales_wall_time_not_the_reported_latencies() -> None:
    slow = LiveFleet(fleet_of(1), speed=1.0, start_wall=START)
    slow.submit(decision("a", input_tokens=3000, output_tokens=400), START)
    [reference] = completions(slow.advance(START + 60))
    assert reference.e2e_s is not None and reference.e2e_s > 1.0

    fast = LiveFleet(fleet_of(1), speed=10.0, start_wall=START)
    fast.submit(decision("a", input_tokens=3000, output_tokens=400), START)
    end_wall = START + reference.e2e_s / 10
    assert completions(fast.advance(end_wall - 0.01)) == []
    [done] = completions(fast.advance(end_wall + 0.01))
    assert done.e2e_s == pytest.approx(reference.e2e_s)
    assert done.ttft_s == pytest.approx(reference.ttft_s)
    assert done.ts == pytest.approx(end_wall)


def test_next_wakeup_lands_on_the_step_end_so_one_advance_processes_it() -> None:
    fleet = LiveFleet(fleet_of(1), speed=3.0, start_wall=START)
    fleet.submit(decision("a", output_tokens=5), START)
    now, wakeups = START, 0
    while (wake := fleet.next_wakeup(now)) is not None:
        assert wake >= now
        now = wake
        fleet.advance(now)
        wakeups += 1
        assert wakeups < 20, "every wakeup must make progress"
    assert fleet.open_attempts == 0


def test_a_redelivered_decision_runs_once() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    once = decision("a")
    assert fleet.submit(once, START) is True
    assert fleet.submit(once, START + 0.01) is False
    assert fleet.submit(decision("a"), START + 0.02) is True  # a new decision (event id) for it runs
    assert len(completions(fleet.advance(START + 30))) == 2
