"""The wire's prefill/decode fields: a heartbeat's ``role`` and ``kv_bytes_per_token``, a routing
decision's ``prefill_instance_id``, a replica plan's ``prefill_replicas``. Events made before
they existed still decode, with the defaults (every instance ``both``, every request whole, a
pool keeps the prefill replicas it runs); a bad value is refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.codec import DecodeError, decode, encode
from schemas.events import MAX_COUNT, Heartbeat, InferenceRequest, ReplicaPlan, RoutingDecision

OLD_HEARTBEAT: dict[str, Any] = {
    "instance_id": "i0",
    "dc": "dc-1",
    "model": "m",
    "model_version": "1",
    "waiting": 0,
    "running": 1,
    "tokens_in_flight": 100,
    "kv_blocks_used": 1,
    "kv_blocks_total": 100,
}
OLD_DECISION: dict[str, Any] = {
    "request_id": "r1",
    "model": "m",
    "slo_class": "interactive",
    "dc": "dc-1",
    "instance_id": "i0",
    "policy": "tokenpilot",
    "decision_latency_s": 0.001,
    "request": {"request_id": "r1", "model": "m", "input_tokens": 600, "output_budget": 16},
}
OLD_PLAN: dict[str, Any] = {"planner": "fleetmind", "model": "m", "dc": "dc-1", "replicas": 3}


def raw(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields).encode()


def test_an_old_heartbeat_is_a_whole_instance_of_unknown_kv_size() -> None:
    beat = decode(Heartbeat, raw(OLD_HEARTBEAT))
    assert (beat.role, beat.kv_bytes_per_token) == ("both", 0)


def test_an_old_decision_runs_whole() -> None:
    assert decode(RoutingDecision, raw(OLD_DECISION)).prefill_instance_id == ""


def test_the_new_fields_round_trip() -> None:
    beat = Heartbeat(**OLD_HEARTBEAT, role="prefill", kv_bytes_per_token=131_072)
    assert decode(Heartbeat, encode(beat)) == beat
    request = InferenceRequest(request_id="r1", model="m", input_tokens=600, output_budget=16)
    decision = RoutingDecision(**{**OLD_DECISION, "request": request}, prefill_instance_id="i1")
    assert decode(RoutingDecision, encode(decision)).prefill_instance_id == "i1"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("role", "kv_producer"),
        ("role", ""),
        ("kv_bytes_per_token", -1),
        ("kv_bytes_per_token", MAX_COUNT + 1),
    ],
)
def test_a_bad_role_or_kv_size_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(Heartbeat, raw({**OLD_HEARTBEAT, field: value}))
    assert f": {field}" in caught.value.reason


def test_a_prefill_instance_id_is_bounded_like_an_instance_id() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(RoutingDecision, raw({**OLD_DECISION, "prefill_instance_id": "p" * 300}))
    assert ": prefill_instance_id" in caught.value.reason


def test_an_old_plan_keeps_the_prefill_replicas_a_pool_runs_and_a_new_one_round_trips() -> None:
    assert decode(ReplicaPlan, raw(OLD_PLAN)).prefill_replicas is None
    plan = ReplicaPlan(**OLD_PLAN, prefill_replicas=1)
    assert decode(ReplicaPlan, encode(plan)).prefill_replicas == 1
    assert decode(ReplicaPlan, raw({**OLD_PLAN, "prefill_replicas": 0})).prefill_replicas == 0


@pytest.mark.parametrize("value", [-1, MAX_COUNT + 1, 1.5, "one"])
def test_a_bad_prefill_count_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(ReplicaPlan, raw({**OLD_PLAN, "prefill_replicas": value}))
    assert ": prefill_replicas" in caught.value.reason
