"""Gateway-run requests counted in their instances' load (``dispatcher/elsewhere.py``)."""

from __future__ import annotations

from dispatcher.elsewhere import RunElsewhere
from schemas.events import Completion, Heartbeat, InferenceRequest, RoutingDecision


def decision(
    rid: str, instance: str, tokens: int, deadline: float | None = None, ts: float | None = None
) -> RoutingDecision:
    request = InferenceRequest(
        request_id=rid, model="m", input_tokens=tokens, output_budget=8, reply="http", deadline_ts=deadline
    )
    return RoutingDecision(
        request_id=rid, model="m", slo_class="interactive", dc="dc", instance_id=instance,
        policy="p", decision_latency_s=0.0, request=request, **({} if ts is None else {"ts": ts}),
    )  # fmt: skip


def end(rid: str, instance: str) -> Completion:
    return Completion(
        request_id=rid, instance_id=instance, model="m", status="ok", arrival_ts=0.0,
        input_tokens=1, output_tokens=1,
    )  # fmt: skip


def beat(instance: str, tokens: int) -> Heartbeat:
    return Heartbeat(
        instance_id=instance, dc="dc", model="m", model_version="1", waiting=0, running=1,
        tokens_in_flight=tokens, kv_blocks_used=0, kv_blocks_total=10,
    )  # fmt: skip


def test_a_gateway_run_request_counts_from_its_decision_to_its_completion() -> None:
    elsewhere = RunElsewhere()
    elsewhere.started(decision("a", "i1", 1000), now=0.0)
    elsewhere.started(decision("b", "i1", 500), now=0.0)
    elsewhere.started(decision("c", "i2", 300), now=0.0)
    elsewhere.started(decision("a", "i1", 1000), now=0.1)  # read again: counted once
    beats = elsewhere.add_to([beat("i1", 40), beat("i2", 0), beat("i3", 7)], now=1.0)
    assert [b.tokens_in_flight for b in beats] == [1540, 300, 7]
    elsewhere.ended(end("a", "i1"))
    elsewhere.ended(end("x", "i3"))  # (the dispatcher's own requests end there too: nothing to take)
    assert elsewhere.tokens(now=2.0) == {"i1": 500, "i2": 300}


def test_an_end_read_before_its_decision_and_a_call_that_never_ends_are_not_counted_forever() -> None:
    elsewhere = RunElsewhere(forget_after_s=60.0)
    elsewhere.ended(end("early", "i1"))
    elsewhere.started(decision("early", "i1", 1000), now=0.0)
    elsewhere.started(decision("lost", "i1", 200), now=0.0)  # its gateway died mid-call
    elsewhere.started(decision("due", "i2", 100, deadline=10.0), now=0.0)
    assert elsewhere.tokens(now=5.0) == {"i1": 200, "i2": 100}
    assert elsewhere.tokens(now=30.0) == {"i1": 200}  # past its deadline
    assert elsewhere.tokens(now=61.0) == {}


def test_a_decision_read_late_is_forgotten_counting_from_when_it_was_taken() -> None:
    elsewhere = RunElsewhere(forget_after_s=60.0)
    # A dispatcher joining reads an earlier run's decisions from the log's start.
    elsewhere.started(decision("old", "i1", 1000, ts=100.0), now=500.0)  # over for 340 s: never counted
    elsewhere.started(decision("recent", "i1", 200, ts=480.0), now=500.0)  # counted until 540
    assert elsewhere.tokens(now=500.0) == {"i1": 200}
    assert elsewhere.tokens(now=541.0) == {}
