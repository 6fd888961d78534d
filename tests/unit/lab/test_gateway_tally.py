"""The gateway scenarios' counting at the client (``lab.faults.gateway_tally``): failed calls,
answers delivered twice, blind stretches, when answers resumed, and the seconds ``/ready`` lied."""

from __future__ import annotations

from collections import Counter

import pytest

from lab.faults.gateway_tally import (
    Attempt,
    Call,
    Sample,
    answered_twice,
    answered_under_other_id,
    blind_since,
    blind_stretches,
    engine_calls,
    failed,
    failed_by,
    failed_mid_answer,
    held_at,
    lies,
    resumed_after,
    retries,
    started_twice,
    unended,
    wait_p99,
)


def answered(call_id: str, start: float, at: float, streamed: bool = False) -> Call:
    """A call answered at once at ``at`` (one attempt)."""
    return Call(
        call_id, streamed, start, at + 0.5, "ok", "", [f"chatcmpl-{call_id}"], [Attempt(start, at, 200)]
    )


def test_failed_unended_and_why() -> None:
    calls = [
        answered("a", 0, 1),
        Call("b", False, 0, 5, "failed", "InternalServerError 503", attempts=[Attempt(0, 1, 503)] * 3),
        Call("c", True, 0, 6, "failed", "APIConnectionError"),
        Call("d", False, 0),  # still waiting at the end
    ]
    assert failed(calls) == 2
    assert unended(calls) == 1
    assert failed_by(calls) == {"InternalServerError 503": 1, "APIConnectionError": 1}


def test_answered_twice_counts_ids_with_two_answers_whichever_records_carry_them() -> None:
    once = answered("a", 0, 1)
    retried = Call("b", False, 0, 3, "ok", "", ["chatcmpl-b"], [Attempt(0, 1, 503), Attempt(2, 3, 200)])
    twice = Call("c", False, 0, 3, "ok", "", ["chatcmpl-c"], [Attempt(0, 1, 200), Attempt(2, 3, 200)])
    resent = [answered("d", 0, 1), answered("d", 4, 5)]  # a user's resend under the same id
    assert answered_twice([once, retried, twice, *resent]) == 2


def test_an_answer_under_another_id_is_counted() -> None:
    good = answered("call-1", 0, 1)
    other = Call("call-2", True, 0, 1, "ok", "", ["chatcmpl-gw-123"], [Attempt(0, 1, 200)])
    no_id = Call("call-3", False, 0, 1, "ok", "", [], [Attempt(0, 1, 200)])
    failed_call = Call("call-4", False, 0, 1, "failed", "x")
    assert answered_under_other_id([good, other, no_id, failed_call]) == 2


def test_retries_are_the_attempts_beyond_the_first_and_what_the_retried_ones_got() -> None:
    calls = [
        Call(
            "a",
            False,
            0,
            9,
            "ok",
            "",
            [],
            [Attempt(0, 1, 503), Attempt(2, 3, None, "ConnectError"), Attempt(4, 5, 200)],
        ),
        answered("b", 0, 1),
    ]
    assert retries(calls) == (2, {"503": 1, "ConnectError": 1})


def test_a_stretch_is_blind_when_calls_wait_and_no_answer_comes_for_long_enough() -> None:
    # Answers every 0.5 s until 10; a call started at 10.2 waits until 18; another starts at 12
    # and fails at 13; answers again from 18.
    calls = [answered(f"n{i}", i * 0.5 - 0.1, i * 0.5) for i in range(1, 21)]
    calls.append(answered("slow", 10.2, 18.0))
    calls.append(
        Call("gone", False, 12.0, 13.0, "failed", "APIConnectionError", attempts=[Attempt(12, 13, None, "x")])
    )
    calls += [answered(f"m{i}", 18 + i * 0.5 - 0.1, 18 + i * 0.5) for i in range(1, 5)]
    [(lo, hi)] = blind_stretches(calls, until=30.0)
    assert (lo, hi) == pytest.approx((10.2, 18.0))
    assert blind_since(blind_stretches(calls, 30.0), since=9.0) == pytest.approx((7.8, 7.8))


def test_a_stuck_call_is_not_blindness_while_others_are_answered() -> None:
    calls = [answered(f"n{i}", i * 0.5 - 0.1, i * 0.5) for i in range(1, 41)]
    calls.append(Call("stuck", False, 1.0, None))  # never ends: its engine hangs
    assert blind_stretches(calls, until=20.0) == []
    # ... but after the last answer, a call still waiting is blind until the run's end.
    assert blind_stretches(calls, until=25.0) == [(20.0, 25.0)]


def test_the_wait_of_a_retried_call_lasts_until_its_answer() -> None:
    call = Call(
        "r", False, 0.0, 9.0, "ok", "", ["chatcmpl-r"], [Attempt(0, 0.1, 503), Attempt(5.0, 9.0, 200)]
    )
    assert blind_stretches([call], until=10.0) == [(0.0, 9.0)]


def test_resumed_counts_from_the_parts_return_to_the_end_of_the_last_blind_stretch() -> None:
    blind = [(100.0, 104.0), (110.0, 131.0)]
    assert resumed_after(blind, fault_start=109.0, back_at=120.0) == pytest.approx(11.0)
    assert resumed_after(blind, fault_start=109.0, back_at=140.0) == 0.0  # flowing by then
    assert resumed_after([], fault_start=109.0, back_at=120.0) == 0.0
    # A blind stretch well before the fault is not this fault's.
    assert resumed_after([(10.0, 50.0)], fault_start=100.0, back_at=30.0) == 0.0


def test_ready_lies_either_way() -> None:
    blind = [(10.0, 20.0)]
    samples = [Sample(0.0, True), Sample(12.0, False), Sample(25.0, False), Sample(28.0, True)]
    # 200 over [10, 12] while blind: 2 s; 503 over [20, 28] while answering: 8 s.
    assert lies(samples, blind, span=(0.0, 30.0)) == pytest.approx((2.0, 8.0))
    # Outside the traffic's span nothing is judged.
    assert lies(samples, blind, span=(5.0, 22.0)) == pytest.approx((2.0, 2.0))
    assert lies([], blind, span=(0.0, 30.0)) == (0.0, 0.0)


def test_answer_p99_covers_the_calls_started_in_the_window_retries_included() -> None:
    calls = [answered(f"n{i}", float(i), i + 0.1) for i in range(100)]
    calls.append(Call("r", False, 50.0, 60.0, "ok", "", [], [Attempt(50, 51, 503), Attempt(55, 58.0, 200)]))
    assert wait_p99(calls, 40.0, 60.0) == pytest.approx(8.0)
    assert wait_p99(calls, 200.0, 300.0) is None


def test_engine_ids_name_calls_by_their_id_or_their_id_and_an_attempt() -> None:
    served = Counter({"call-1": 1, "call-2-1": 1, "call-2-2": 1, "call-3-1": 2, "a1b2c3": 1, "call-5:1": 1})
    named = engine_calls(served, ["call-1", "call-2", "call-3", "call-4", "call-5"])
    assert named == {
        "call-1": "call-1",
        "call-2-1": "call-2",
        "call-2-2": "call-2",
        "call-3-1": "call-3",
        "call-5:1": "call-5",
    }
    placed = {"call-1": 1, "call-2": 2, "call-3": 2, "call-5": 1}
    # call-2's two starts are its two placed attempts (re-placed after its engine died): not
    # twice; call-3's attempt 1 started twice is, though call-3 had two placements.
    assert started_twice(served, named, placed) == 1
    # Ids without an attempt: more starts than placements.
    assert started_twice(Counter({"x": 2}), {"x": "x"}, {"x": 2}) == 0
    assert started_twice(Counter({"x": 1, "y": 1}), {"x": "x", "y": "y"}, {"x": 1}) == 1


def test_held_calls_are_those_in_the_gateway_at_the_kill() -> None:
    calls = [
        answered("before", 0, 1),  # ended before
        Call("in", False, 4.0, 12.0, "failed", "x", attempts=[Attempt(4.0, 10.0, None, "ReadError")]),
        Call("after", False, 11.0, 12.0, "failed", "x", attempts=[Attempt(11.0, 11.1, None, "ConnectError")]),
        Call("streaming", True, 2.0, 15.0, "failed", "x", attempts=[Attempt(2.0, 3.0, 200)]),
    ]
    assert held_at(calls, 10.0) == {"in", "streaming"}


def test_a_streamed_call_that_broke_mid_answer_is_told_apart_from_other_failures() -> None:
    broke = Call(
        "a", streamed=True, started=0.0, outcome="failed", error="APIError", answer_ids=["chatcmpl-a"]
    )
    refused = Call("b", streamed=True, started=0.0, outcome="failed", error="APIConnectionError")
    whole = Call("c", streamed=False, started=0.0, outcome="failed", error="APIError")
    assert failed([broke, refused, whole]) == 3 and failed_mid_answer([broke, refused, whole]) == 1
