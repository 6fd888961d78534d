"""Every wire event is bounded and finite: poison values are rejected at decode time, with the
reason naming the field (so the codec dead-letters them), and real events still validate."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from schemas import events
from schemas.codec import DecodeError, dead_letter, decode, encode
from schemas.events import (
    AdmissionDecision,
    BatchJob,
    Completion,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    KvEvent,
    RoutingDecision,
)
from sim.workloads.trace import load_workload
from traffic.loadgen import to_inference_request

TRACES = Path(__file__).resolve().parents[3] / "sim" / "traces"

REQUEST: dict[str, Any] = {
    "ts": 1_700_000_000.0,
    "request_id": "r1",
    "model": "llama3-8b",
    "input_tokens": 1000,
    "output_budget": 256,
    "prompt_block_hashes": [1, 2],
    "deadline_ts": 1_700_000_060.0,
}
COMPLETION: dict[str, Any] = {
    "request_id": "r1",
    "instance_id": "i0",
    "model": "llama3-8b",
    "status": "ok",
    "arrival_ts": 1_700_000_000.0,
    "ttft_s": 0.5,
    "tpot_s": 0.02,
    "e2e_s": 2.0,
    "input_tokens": 1000,
    "output_tokens": 200,
}
HEARTBEAT: dict[str, Any] = {
    "instance_id": "i0",
    "dc": "dc-1",
    "model": "llama3-8b",
    "model_version": "1",
    "waiting": 0,
    "running": 1,
    "tokens_in_flight": 100,
    "kv_blocks_used": 1,
    "kv_blocks_total": 100,
}


def raw(base: dict[str, Any], **changes: Any) -> bytes:
    # json.dumps writes NaN / Infinity literals, as a careless producer would
    return json.dumps({**base, **changes}).encode()


def rejected(kind: type[Event], base: dict[str, Any], field: str, value: Any) -> str:
    with pytest.raises(DecodeError) as caught:
        decode(kind, raw(base, **{field: value}))
    reason = caught.value.reason
    assert f": {field}" in reason, reason
    return reason


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attempt", 1e6),
        ("attempt", 1_000_000),
        ("attempt", 0),
        ("input_tokens", 1e12),
        ("input_tokens", 10**12),
        ("output_budget", 2**32),
        ("prompt", "x" * (events.MAX_PROMPT_CHARS + 1)),
        ("prompt_token_ids", [events.MAX_TOKEN_ID + 1]),
        ("deadline_ts", float("nan")),
        ("deadline_ts", 1e20),
        ("deadline_ts", float("inf")),
        ("deadline_ts", -1.0),
        ("ts", 1e20),
        ("ts", float("inf")),
        ("ts", float("nan")),
        ("model", "m" * 300),
        ("request_id", "r" * 300),
        ("tenant", "t" * 300),
        ("task_type", "c" * 300),
        ("slo_class", "s" * 300),
        ("home_dc", "d" * 300),
        ("prompt_block_hashes", list(range(200_000))),
        ("prompt_block_hashes", [2**63]),
        ("prompt_block_hashes", [-(2**63) - 1]),
        ("allowed_regions", [f"dc-{i}" for i in range(65)]),
        ("allowed_regions", ["d" * 300]),
    ],
)
def test_poison_requests_are_rejected_naming_the_field(field: str, value: Any) -> None:
    rejected(InferenceRequest, REQUEST, field, value)


def test_the_reason_says_what_is_wrong() -> None:
    assert "less than or equal to 1000" in rejected(InferenceRequest, REQUEST, "attempt", 1e6)
    assert "finite number" in rejected(InferenceRequest, REQUEST, "deadline_ts", float("nan"))
    assert "at most 256 characters" in rejected(InferenceRequest, REQUEST, "model", "m" * 300)
    assert f"at most {events.MAX_BLOCK_HASHES} items" in rejected(
        InferenceRequest, REQUEST, "prompt_block_hashes", list(range(200_000))
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttft_s", float("inf")),
        ("tpot_s", float("-inf")),
        ("e2e_s", float("nan")),
        ("e2e_s", 1e7),
        ("ttft_s", -0.1),
        ("arrival_ts", 1e20),
        ("deadline_ts", float("nan")),
        ("attempt", 1e6),
        ("input_tokens", 1e12),
        ("cached_tokens", 2**32),
        ("output_tokens", 1e12),
        ("slo_class", "s" * 300),
        ("instance_id", "i" * 300),
    ],
)
def test_poison_completions_are_rejected_naming_the_field(field: str, value: Any) -> None:
    rejected(Completion, COMPLETION, field, value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("waiting", 10**10),
        ("running", 1e12),
        ("tokens_in_flight", 2**63),
        ("kv_blocks_used", -1),
        ("kv_blocks_total", 0),
        ("kv_blocks_total", 10**10),
        ("profile", "p" * 300),
        ("ts", float("inf")),
    ],
)
def test_poison_heartbeats_are_rejected_naming_the_field(field: str, value: Any) -> None:
    rejected(Heartbeat, HEARTBEAT, field, value)


def test_kv_events_are_bounded_like_prompts() -> None:
    base = {"instance_id": "i0", "model": "m", "kind": "stored", "block_hashes": [1]}
    rejected(KvEvent, base, "block_hashes", list(range(200_000)))
    rejected(KvEvent, base, "block_hashes", [2**64])


def test_decisions_are_bounded() -> None:
    request = InferenceRequest.model_validate(REQUEST).model_dump(mode="json")
    routing = {
        "request_id": "r1", "model": "m", "slo_class": "interactive", "dc": "dc-1", "instance_id": "i0",
        "policy": "tokenpilot", "decision_latency_s": 1e-5, "request": request,
    }  # fmt: skip
    rejected(RoutingDecision, routing, "decision_latency_s", float("inf"))
    rejected(RoutingDecision, routing, "predicted_ttft_s", float("nan"))
    rejected(RoutingDecision, routing, "reason", "x" * 2000)
    rejected(RoutingDecision, routing, "attempt", 1e6)
    with pytest.raises(DecodeError, match=r"request\.deadline_ts"):
        decode(RoutingDecision, raw(routing, request={**request, "deadline_ts": 1e20}))
    admission = {
        "request_id": "r1", "model": "m", "slo_class": "interactive", "action": "admit", "policy": "p",
    }  # fmt: skip
    rejected(AdmissionDecision, admission, "predicted_ttft_s", float("inf"))
    rejected(AdmissionDecision, admission, "queue_pool", "q" * 300)


def test_fleet_events_are_bounded() -> None:
    notice = {"kind": "replica_advice", "dc": "dc-1", "model": "m", "model_version": "1", "delta": 1}
    assert decode(FleetEvent, raw(notice)).delta == 1
    assert decode(FleetEvent, raw(notice, delta=-events.MAX_COUNT)).delta == -events.MAX_COUNT
    rejected(FleetEvent, notice, "kind", "dc_sideways")
    rejected(FleetEvent, notice, "model", "")
    rejected(FleetEvent, notice, "dc", "d" * 300)
    rejected(FleetEvent, notice, "detail", "x" * 2000)
    rejected(FleetEvent, notice, "delta", 2**40)
    rejected(FleetEvent, notice, "ts", float("nan"))


def test_a_finite_prediction_out_of_range_is_saturated_not_rejected() -> None:
    """A pessimistic estimate (a huge queue) must not fail the decision that carries it."""
    base: dict[str, Any] = {
        "request_id": "r1", "model": "m", "slo_class": "interactive", "action": "admit", "policy": "p"
    }  # fmt: skip
    assert decode(AdmissionDecision, raw(base, predicted_ttft_s=4.9e7)).predicted_ttft_s == 1e6
    assert decode(AdmissionDecision, raw(base, predicted_ttft_s=-3.0)).predicted_ttft_s == 0.0
    assert AdmissionDecision(**base, predicted_ttft_s=1e300).predicted_ttft_s == events.MAX_DURATION_S


def test_batch_jobs_are_bounded_and_expand_to_valid_requests() -> None:
    job = {"job_id": "job-1", "deadline_s": 60.0, "requests": [REQUEST]}
    assert decode(BatchJob, raw(job)).requests[0].request_id == "r1"
    rejected(BatchJob, job, "deadline_s", float("inf"))
    rejected(BatchJob, job, "deadline_s", 1e8)
    rejected(BatchJob, job, "requests", [REQUEST] * 10_001)
    rejected(BatchJob, job, "tenant", "")
    with pytest.raises(DecodeError, match="ts \\+ deadline_s"):
        decode(BatchJob, raw(job, ts=events.MAX_TS - 10))
    with pytest.raises(DecodeError, match="prefixed with the job id"):
        decode(BatchJob, raw(job, requests=[{**REQUEST, "request_id": "r" * 251}]))
    # already prefixed: the expansion keeps the id as it is
    assert decode(BatchJob, raw(job, requests=[{**REQUEST, "request_id": "job-1/" + "r" * 250}]))


def test_a_dead_letter_never_fails_on_a_long_reason() -> None:
    """The reason can quote a field name the bad input chose: cut, not rejected."""
    bad = json.dumps({**REQUEST, "x" * 5000: 1}).encode()
    with pytest.raises(DecodeError) as caught:
        decode(InferenceRequest, bad)
    letter = dead_letter("tf.requests", bad, None, caught.value.reason)
    assert len(letter.reason) == events.MAX_REASON_LENGTH and letter.reason.endswith("...")


def test_the_limits_are_valid_values() -> None:
    extreme = InferenceRequest.model_validate(
        {
            **REQUEST,
            "ts": events.MAX_TS,
            "deadline_ts": events.MAX_TS,
            "attempt": events.MAX_ATTEMPT,
            "input_tokens": events.MAX_TOKENS,
            "output_budget": events.MAX_TOKENS,
            "model": "m" * events.MAX_NAME_LENGTH,
            "prompt_block_hashes": [events.MIN_BLOCK_HASH, events.MAX_BLOCK_HASH]
            * (events.MAX_BLOCK_HASHES // 2),
            "allowed_regions": [f"dc-{i}" for i in range(events.MAX_REGIONS)],
        }
    )
    assert decode(InferenceRequest, encode(extreme)) == extreme
    assert decode(InferenceRequest, raw(REQUEST, ts=0, deadline_ts=0)).ts == 0


@pytest.mark.parametrize(
    "trace",
    ["mooncake/conversation_trace.jsonl", "azure/AzureLLMInferenceTrace_code.csv",
     "azure/AzureLLMInferenceTrace_conv.csv"],
)  # fmt: skip
def test_every_trace_request_still_validates_and_round_trips(trace: str) -> None:
    workload = load_workload(TRACES / trace)
    assert workload.requests
    for request in workload.requests:
        event = to_inference_request(request, "llama3-8b", 1_700_000_000.0)
        assert decode(InferenceRequest, encode(event)) == event


def test_a_huge_bad_message_is_dead_lettered_within_what_the_broker_accepts() -> None:
    huge = b'{"request_id": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    letter = dead_letter("tf.requests", huge, b"pool", "invalid InferenceRequest: too big")
    assert len(encode(letter)) < 1024 * 1024  # Kafka's default max request size
    assert letter.truncated and letter.original_size == len(huge)
    assert letter.original_sha256 == hashlib.sha256(huge).hexdigest()
    assert base64.b64decode(letter.original_b64) == huge[: events.MAX_DEAD_LETTER_ORIGINAL]
    small = dead_letter("tf.requests", b"{not json", None, "invalid JSON")
    assert not small.truncated and base64.b64decode(small.original_b64) == b"{not json"
