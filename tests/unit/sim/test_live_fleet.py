"""The live fleet: the simulator's engines driven by wall-clock times passed in (no clock reads)."""

from __future__ import annotations

import pytest

from schemas.events import Completion, KvEvent, ResponseStarted
from sim.loop.live import InstanceEvent, LiveFleet
from tests.unit.sim.helpers import fleet_of
from tests.unit.sim.helpers import routing_decision as decision

START = 1_000.0


def completions(events: list[InstanceEvent]) -> list[Completion]:
    return [e for e in events if isinstance(e, Completion)]


def first_tokens(events: list[InstanceEvent]) -> list[ResponseStarted]:
    return [e for e in events if isinstance(e, ResponseStarted)]


def until_first_token(fleet: LiveFleet, now: float) -> tuple[float, list[InstanceEvent]]:
    """Step through wakeups until some first token is reported; (wall time, events so far)."""
    seen: list[InstanceEvent] = []
    while not first_tokens(seen):
        wake = fleet.next_wakeup(now)
        assert wake is not None, "the fleet went idle without a first token"
        now = wake
        seen.extend(fleet.advance(now))
    return now, seen


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
    events = fleet.advance(START + 13)
    [gave_up] = completions(events)
    assert first_tokens(events) == []  # a client that gave up never sees a token
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
    # A second decision for the same attempt (a scheduler re-deciding a redelivered request: a new
    # event id) must not run it twice either; the client's retry (attempt 2) runs.
    assert fleet.submit(decision("a"), START + 0.02) is False
    retry = decision("a").model_copy(update={"attempt": 2})
    assert fleet.submit(retry, START + 0.03) is True
    assert sorted(c.attempt for c in completions(fleet.advance(START + 30))) == [1, 2]


def test_the_first_token_is_reported_before_its_completion_with_the_same_ttft() -> None:
    fleet = LiveFleet(fleet_of(1), speed=2.0, start_wall=START)
    fleet.submit(decision("a", input_tokens=3000, output_tokens=200, at=START), START)
    at, so_far = until_first_token(fleet, START)
    [started] = first_tokens(so_far)
    assert completions(so_far) == []  # 199 tokens still to go
    assert (started.request_id, started.attempt, started.instance_id, started.model) == (
        "a",
        1,
        "i0",
        "llama3-8b",
    )
    assert 0 < started.ttft_s < 1.0 and started.ts == pytest.approx(at)
    assert started.ts == pytest.approx(START + started.ttft_s / 2.0)  # emulated seconds, at x2
    events = fleet.advance(START + 60)
    assert first_tokens(events) == []  # reported once
    [done] = completions(events)
    assert done.ttft_s == pytest.approx(started.ttft_s) and done.ts > started.ts


def test_a_one_token_response_starts_and_ends_in_one_step_first_token_first() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("one", output_tokens=1), START)
    events = [e for e in fleet.advance(START + 30) if not isinstance(e, KvEvent)]
    assert [type(e) for e in events] == [ResponseStarted, Completion]
    assert events[0].ts == events[1].ts and events[1].ttft_s == pytest.approx(events[0].ttft_s)


def test_aborting_a_waiting_attempt_ends_it_at_once() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("long", input_tokens=60_000, output_tokens=20, slo_class="long_context"), START)
    fleet.submit(decision("queued", at=START + 0.01), START + 0.01)  # joins at the step boundary
    assert fleet.heartbeats(START + 0.01)[0].waiting == 1
    assert fleet.abort("queued", 1, START + 0.02) is True
    [gone] = completions(fleet.advance(START + 0.02))
    assert (gone.request_id, gone.status, gone.output_tokens, gone.ttft_s) == ("queued", "aborted", 0, None)
    assert gone.ts == pytest.approx(START + 0.02) and gone.e2e_s == pytest.approx(0.01)
    beat = fleet.heartbeats(START + 0.02)[0]
    assert (beat.waiting, beat.running) == (0, 1)
    assert fleet.abort("queued", 1, START + 0.03) is False  # already ended
    events = fleet.advance(START + 60)
    assert [c.request_id for c in completions(events)] == ["long"]
    assert [f.request_id for f in first_tokens(events)] == ["long"]
    assert completions(events)[0].status == "ok" and fleet.open_attempts == 0


def test_aborting_a_running_attempt_ends_it_at_its_step_end() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("stream", output_tokens=2000), START)
    at, _ = until_first_token(fleet, START)
    hang_up = at + 0.5
    assert fleet.abort("stream", 1, hang_up) is True
    assert fleet.abort("stream", 1, hang_up) is False  # already ending
    assert fleet.abort("stream", 2, hang_up) is False and fleet.abort("other", 1, hang_up) is False
    assert completions(fleet.advance(hang_up)) == [] and fleet.open_attempts == 1
    wake = fleet.next_wakeup(hang_up)
    assert wake is not None and hang_up <= wake < hang_up + 0.05  # the step in progress
    [ended] = completions(fleet.advance(wake))
    assert ended.status == "aborted" and ended.ttft_s is not None and ended.ts == pytest.approx(wake)
    assert 0 < ended.output_tokens < 2000  # what it streamed until then
    assert fleet.open_attempts == 0 and fleet.next_wakeup(wake) is None
    beat = fleet.heartbeats(wake)[0]
    assert (beat.waiting, beat.running, beat.tokens_in_flight) == (0, 0, 0)


def test_an_attempt_aborted_mid_prefill_never_reports_a_first_token() -> None:
    fleet = LiveFleet(fleet_of(1), start_wall=START)
    fleet.submit(decision("huge", input_tokens=200_000, output_tokens=4, slo_class="long_context"), START)
    assert fleet.abort("huge", 1, START + 1.0) is True
    events = fleet.advance(START + 60)
    [ended] = completions(events)
    assert first_tokens(events) == [] and ended.ttft_s is None
    # It stops after the prompt chunk in progress, long before its prefill would have finished.
    assert (ended.status, ended.output_tokens) == ("aborted", 0) and START + 1.0 <= ended.ts < START + 1.5
