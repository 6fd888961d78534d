"""Property: every schema-valid request (the field bounds' extremes included) can be encoded and
decoded, routed, stored through the feedback sink and summarised (real embedded ClickHouse)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.routing import RoutingService
from infra.clickhouse import FeedbackSink, connect, migrate, summary
from schemas import events
from schemas.codec import decode, encode
from schemas.events import (
    Completion,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
)
from tests.functional.fakes import MemoryState

DCS = ("dc-a", "dc-b")
MAX_TS = events.MAX_TS
EXAMPLES = int(os.environ.get("TOKENFLEET_CONTRACT_EXAMPLES", "60"))  # more for a deeper search

# --- strategies -------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=events.MAX_NAME_LENGTH)
labels = st.text(max_size=events.MAX_NAME_LENGTH)
stamps = st.one_of(st.just(0.0), st.just(MAX_TS), st.floats(0, MAX_TS, allow_nan=False))
durations = st.one_of(
    st.none(), st.just(0.0), st.just(events.MAX_DURATION_S), st.floats(0, events.MAX_DURATION_S)
)
tokens = st.one_of(st.just(events.MAX_TOKENS), st.integers(1, events.MAX_TOKENS))
counts = st.one_of(st.just(0), st.just(events.MAX_COUNT), st.integers(0, events.MAX_COUNT))
block_hash = st.integers(events.MIN_BLOCK_HASH, events.MAX_BLOCK_HASH)


def _near_cap(missing: int) -> tuple[int, ...]:
    """A block list ``missing`` short of the cap, the int64 extremes at both ends."""
    n = events.MAX_BLOCK_HASHES - missing
    return (events.MIN_BLOCK_HASH, *range(1, n - 1), events.MAX_BLOCK_HASH)


block_lists = st.one_of(
    st.lists(block_hash, max_size=40).map(tuple),
    st.integers(0, 3).map(_near_cap),  # built, not drawn element by element: keeps examples fast
)
regions = st.lists(st.one_of(st.sampled_from(DCS), labels), max_size=events.MAX_REGIONS).map(tuple)
slo_classes = st.one_of(st.none(), st.sampled_from(sorted(DEFAULT_SLO_CLASSES)), labels)


@st.composite
def requests(draw: st.DrawFn) -> InferenceRequest:
    return InferenceRequest(
        event_id=events.new_event_id() + draw(st.text(max_size=events.MAX_EVENT_ID_LENGTH - 32)),
        ts=draw(stamps),
        request_id=draw(names),
        attempt=draw(st.one_of(st.just(events.MAX_ATTEMPT), st.integers(1, events.MAX_ATTEMPT))),
        tenant=draw(names),
        model=draw(names),
        task_type=draw(labels),
        prompt_block_hashes=draw(block_lists),
        input_tokens=draw(tokens),
        output_budget=draw(tokens),
        slo_class=draw(slo_classes),
        deadline_ts=draw(st.one_of(st.none(), stamps)),
        allowed_regions=draw(regions),
        home_dc=draw(st.one_of(st.sampled_from(("", *DCS)), st.text(max_size=events.MAX_HOME_DC_LENGTH))),
        **draw(
            st.one_of(
                st.just({}),
                st.builds(lambda text: {"prompt": text}, st.text(max_size=300)),
                st.builds(
                    lambda ids: {"prompt_token_ids": tuple(ids)},
                    st.lists(st.integers(0, events.MAX_TOKEN_ID), min_size=1, max_size=50),
                ),
                st.builds(
                    lambda texts: {
                        "messages": tuple(events.ChatMessage(role="user", content=t) for t in texts)
                    },
                    st.lists(st.text(max_size=100), min_size=1, max_size=4),
                ),
            )
        ),
        sampling=events.Sampling(
            temperature=draw(st.one_of(st.none(), st.floats(0, 2))),
            stop=tuple(draw(st.lists(st.text(min_size=1, max_size=20), max_size=events.MAX_STOP))),
        ),
        reply=draw(st.sampled_from(("kafka", "http"))),
    )


@st.composite
def heartbeats(draw: st.DrawFn, model: str) -> list[Heartbeat]:
    return [
        Heartbeat(
            ts=draw(stamps),
            instance_id=f"i{k}",
            dc=dc,
            model=model,
            model_version="v1",
            profile=draw(st.one_of(st.just("llama3-8b-h100"), labels)),
            waiting=draw(counts),
            running=draw(counts),
            tokens_in_flight=draw(counts),
            kv_blocks_used=draw(counts),
            kv_blocks_total=draw(st.one_of(st.just(events.MAX_COUNT), st.integers(1, events.MAX_COUNT))),
        )
        for k, dc in enumerate(DCS)
    ]


def completion_of(data: st.DataObject, request: InferenceRequest, instance_id: str) -> Completion:
    return Completion(
        ts=data.draw(stamps),
        request_id=request.request_id,
        attempt=request.attempt,
        instance_id=instance_id,
        model=request.model,
        tenant=request.tenant,
        slo_class=data.draw(st.one_of(st.sampled_from(sorted(DEFAULT_SLO_CLASSES)), labels)),
        status=data.draw(st.sampled_from(("ok", "timeout", "aborted", "error"))),
        arrival_ts=request.ts,
        ttft_s=data.draw(durations),
        tpot_s=data.draw(durations),
        e2e_s=data.draw(durations),
        input_tokens=request.input_tokens,
        cached_tokens=data.draw(st.one_of(st.just(0), tokens)),
        output_tokens=data.draw(st.one_of(st.just(0), tokens)),
        deadline_ts=request.deadline_ts,
    )


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    # The embedded engine hosts one data dir per process: one store for the module, closed after.
    with connect("chdb:///" + str(tmp_path_factory.mktemp("contracts") / "clickhouse")) as opened:
        migrate(opened)
        yield opened


@pytest.fixture(scope="module")
def sink(client: Client) -> FeedbackSink:
    return FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=1.0)


def round_trip(event: Event) -> None:
    assert decode(type(event), encode(event)) == event


def stored(client: Client, table: str, event_id: str, columns: str) -> tuple[Any, ...]:
    rows = client.query(
        f"SELECT {columns} FROM {table} FINAL WHERE event_id = {{id:String}}", parameters={"id": event_id}
    ).result_rows
    assert len(rows) == 1, (table, rows)
    return tuple(rows[0])


def millis(ts: float | None) -> int | None:
    return None if ts is None else int(ts * 1000)  # what DateTime64(3) keeps (truncated)


# --- the property -------------------------------------------------------------------------------


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_valid_request_is_routed_stored_and_summarised(
    data: st.DataObject, client: Client, sink: FeedbackSink
) -> None:
    request = data.draw(requests(), label="request")
    # (a) the wire
    round_trip(request)

    # (b) routing on a small pool of extreme-but-valid instances
    state = MemoryState()
    for beat in data.draw(heartbeats(request.model), label="heartbeats"):
        round_trip(beat)
        state.record(beat)
    view = state.view(request.model)
    assert view is not None and len(view) == len(DCS)
    service = RoutingService("tokenpilot")
    (routed,) = service.route(request.model, [request], view, now=request.ts)
    admission, routing = routed.admission, routed.routing
    event(f"admission: {admission.action}")
    event(f"blocks near the cap: {len(request.prompt_block_hashes) > 1000}")
    assert admission.request_id == request.request_id and admission.attempt == request.attempt
    round_trip(admission)
    if routing is not None:
        round_trip(routing)

    # (c) the store, values read back as written (no wrap, no clamp)
    completion = completion_of(data, request, routing.instance_id if routing else "i0")
    round_trip(completion)
    assert sink.write_requests([request]) == 1
    assert sink.write_admission([admission]) == 1
    assert sink.write_routing([routing] if routing else []) == (1 if routing else 0)
    assert sink.write_completions([completion]) == 1
    assert stored(
        client,
        "requests",
        request.event_id,
        "attempt, input_tokens, output_budget, prompt_blocks, toUnixTimestamp64Milli(ts), "
        "toUnixTimestamp64Milli(deadline_ts), model, allowed_regions",
    ) == (
        request.attempt,
        request.input_tokens,
        request.output_budget,
        len(request.prompt_block_hashes),
        millis(request.ts),
        millis(request.deadline_ts),
        request.model,
        list(request.allowed_regions),
    )
    assert stored(client, "admission_decisions", admission.event_id, "attempt, action, predicted_ttft_s") == (
        admission.attempt,
        admission.action,
        admission.predicted_ttft_s,
    )
    if routing is not None:
        assert stored(
            client, "routing_decisions", routing.event_id, "attempt, input_tokens, predicted_ttft_s"
        ) == (routing.attempt, request.input_tokens, routing.predicted_ttft_s)
    assert stored(
        client,
        "completions",
        completion.event_id,
        "attempt, cached_tokens, output_tokens, e2e_s, toUnixTimestamp64Milli(arrival_ts)",
    ) == (
        completion.attempt,
        completion.cached_tokens,
        completion.output_tokens,
        completion.e2e_s,
        millis(completion.arrival_ts),
    )

    # (d) the summary: each request once, in one class (the store is shared by the examples, and
    # a request_id drawn twice is one request, of the class one of them declared)
    result = summary(client, since_ts=0)
    total = result["total"]
    assert isinstance(total, dict) and total["completions"] >= 1
    per_class = result["per_class"]
    assert isinstance(per_class, dict)
    assert sum(entry.get("requests", 0) for entry in per_class.values()) == total["requests"] >= 1


def test_the_extremes_together(client: Client, sink: FeedbackSink) -> None:
    """Every bound at once, deterministically (hypothesis reaches each, not necessarily all)."""
    request = InferenceRequest(
        ts=MAX_TS,
        request_id="r" * events.MAX_NAME_LENGTH,
        attempt=events.MAX_ATTEMPT,
        model="m" * events.MAX_NAME_LENGTH,
        prompt_block_hashes=_near_cap(0),
        input_tokens=events.MAX_TOKENS,
        output_budget=events.MAX_TOKENS,
        prompt="p" * events.MAX_PROMPT_CHARS,
        deadline_ts=MAX_TS,
        allowed_regions=DCS,
    )
    state = MemoryState()
    for k, dc in enumerate(DCS):
        state.record(
            Heartbeat(
                ts=MAX_TS, instance_id=f"i{k}", dc=dc, model=request.model, model_version="v1",
                waiting=events.MAX_COUNT, running=events.MAX_COUNT, tokens_in_flight=events.MAX_COUNT,
                kv_blocks_used=events.MAX_COUNT, kv_blocks_total=events.MAX_COUNT,
            )
        )  # fmt: skip
    (routed,) = RoutingService("tokenpilot").route(
        request.model, [request], state.view(request.model), MAX_TS
    )
    assert routed.routing is not None
    # the predicted TTFT on this pool is ~5e7 s: saturated at the bound, not an error
    assert routed.routing.predicted_ttft_s == events.MAX_DURATION_S
    completion = Completion(
        ts=MAX_TS, request_id=request.request_id, attempt=request.attempt, instance_id="i0",
        model=request.model, status="ok", arrival_ts=0.0, ttft_s=events.MAX_DURATION_S,
        tpot_s=events.MAX_DURATION_S, e2e_s=events.MAX_DURATION_S, input_tokens=events.MAX_TOKENS,
        cached_tokens=events.MAX_TOKENS, output_tokens=events.MAX_TOKENS, deadline_ts=MAX_TS,
    )  # fmt: skip
    assert sink.write_requests([request]) == 1
    assert sink.write_admission([routed.admission]) == 1
    assert sink.write_routing([routed.routing]) == 1
    assert sink.write_completions([completion]) == 1
    assert summary(client, since_ts=0)["total"]


def test_fleet_events_at_their_bounds_are_stored_as_written(client: Client, sink: FeedbackSink) -> None:
    longest = events.MAX_NAME_LENGTH
    extremes = [
        FleetEvent(
            ts=MAX_TS, kind="replica_advice", dc="d" * longest, model="m" * longest,
            model_version="v" * longest, detail="x" * events.MAX_REASON_LENGTH, delta=events.MAX_COUNT,
            tenant="t" * longest, worker="w" * longest,
        ),
        FleetEvent(ts=0.0, kind="reservation_moved", dc="", model="m", delta=-events.MAX_COUNT),
    ]  # fmt: skip
    for notice in extremes:
        round_trip(notice)
    assert sink.write_fleet_events([*extremes, extremes[0]]) == 2  # a repeat is stored once
    for notice in extremes:
        assert stored(
            client,
            "fleet_events",
            notice.event_id,
            "toUnixTimestamp64Milli(ts), kind, dc, model, detail, delta",
        ) == (millis(notice.ts), notice.kind, notice.dc, notice.model, notice.detail, notice.delta)


def test_a_batch_of_valid_requests_spanning_many_months_is_stored(client: Client) -> None:
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=0.2)
    batch = [
        InferenceRequest(
            ts=month * 32 * 86_400.0, request_id=f"m{month}", model="m", input_tokens=1, output_budget=1
        )
        for month in range(120)
    ]
    assert sink.write_requests(batch) == len(batch)
