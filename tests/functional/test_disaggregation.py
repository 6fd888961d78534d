"""Prefill/decode disaggregation through the service's wiring: the engines' heartbeats (each
instance's role and KV size) and the settings' KV links (``worker.scheduling.dc_view``) make
the snapshot cache's view, and the routing service's decision names the instance that prefills
the request (``RoutingDecision.prefill_instance_id``), or none when it runs whole. The end of
the request's prefill leg, read back from ``tf.first-tokens`` (``ResponseStarted.prefill_leg``),
calibrates TokenPilot on the prefill instance, as the simulator's ``PrefillDone`` does."""

from __future__ import annotations

import numpy as np
import pytest

from agents.routing import RoutingService
from infra.settings import Settings
from schemas.events import Completion, Heartbeat, InferenceRequest, ResponseStarted, Role, RoutingDecision
from streams.snapshot import SnapshotCache
from worker.scheduling import dc_view

# One prefill instance and two decode instances in DC "A", each decode instance running 500
# requests of 4 000 tokens: decode batches that stretch every prefill step there, so a long prompt
# served whole would miss its TTFT objective and prefilled apart would not.
FLEET: tuple[tuple[str, Role, int], ...] = (("p", "prefill", 0), ("d1", "decode", 500), ("d2", "decode", 500))
KV_BYTES = 128 * 1024


def beat(instance: str, role: Role, running: int) -> Heartbeat:
    return Heartbeat(
        instance_id=instance, dc="A", model="m", model_version="1", profile="llama3-8b-h100",
        waiting=0, running=running, tokens_in_flight=running * 4000, kv_blocks_used=running * 8,
        kv_blocks_total=4000, role=role, kv_bytes_per_token=KV_BYTES,
    )  # fmt: skip


def decided(
    policy: str, settings: Settings, input_tokens: int, service: RoutingService | None = None
) -> RoutingDecision:
    cache = SnapshotCache(dc_view(settings))
    for instance in FLEET:
        cache.record(beat(*instance))
    request = InferenceRequest(
        request_id="r", model="m", slo_class="interactive", input_tokens=input_tokens, output_budget=200
    )
    service = service or RoutingService(policy)
    (routed,) = service.route("m", [request], cache.view("m"), request.ts)
    assert routed.routing is not None, routed.admission
    return routed.routing


LINKED = Settings(kv_link_gbps={"A": 400.0})


def test_tokenpilot_names_the_prefill_instance_of_a_long_prompt_beside_busy_decodes() -> None:
    decision = decided("tokenpilot", LINKED, 21_000)
    assert (decision.prefill_instance_id, decision.instance_id in ("d1", "d2")) == ("p", True)


@pytest.mark.parametrize("settings", [Settings(), Settings(kv_link_gbps={"B": 400.0})])
def test_without_a_link_in_the_instances_dc_every_request_runs_whole(settings: Settings) -> None:
    decision = decided("tokenpilot", settings, 21_000)
    assert decision.prefill_instance_id == "" and decision.instance_id in ("d1", "d2")


def test_a_peer_that_disaggregates_by_rule_is_wired_the_same_way() -> None:
    assert decided("llm-d-pd", LINKED, 600).prefill_instance_id == "p"


def client_end(decision: RoutingDecision) -> Completion:
    """The end of ``decision``'s request on its decode instance, 9 s after its arrival."""
    arrival = decision.request.ts
    return Completion(
        ts=arrival + 9.0, request_id="r", instance_id=decision.instance_id, model="m", status="ok",
        arrival_ts=arrival, ttft_s=5.0, tpot_s=0.02, e2e_s=9.0, input_tokens=21_000, output_tokens=200,
    )  # fmt: skip


def test_the_end_of_the_prefill_leg_calibrates_tokenpilot_and_the_clients_first_token_does_not() -> None:
    service = RoutingService("tokenpilot")
    decision = decided("tokenpilot", LINKED, 21_000, service)
    model = service.scheduler_for("m").instance_selection.model_for("llama3-8b-h100")  # type: ignore[attr-defined]
    before = model.theta.copy()
    arrival = decision.request.ts
    leg = ResponseStarted(
        ts=arrival + 0.9, request_id="r", instance_id="p", model="m", ttft_s=0.9, prefill_leg=True
    )
    service.observe_first_token(leg)
    learned = model.theta.copy()
    assert not np.array_equal(learned, before)  # the prefill instance's own first-token time
    # The client's first token and end, on the decode instance, include the transfer: nothing learnt.
    first = ResponseStarted(
        ts=arrival + 5.0, request_id="r", instance_id=decision.instance_id, model="m", ttft_s=5.0
    )
    service.observe_first_token(first)
    service.observe_completion(client_end(decision))
    assert np.array_equal(model.theta, learned)


def test_without_the_end_of_the_prefill_leg_tokenpilot_learns_from_the_clients_end() -> None:
    """The contrast to the test above: a pair whose prefill leg was not reported (a prefill
    that fell back to local prefill) is learnt from at its end, as a request served whole."""
    service = RoutingService("tokenpilot")
    decision = decided("tokenpilot", LINKED, 21_000, service)
    model = service.scheduler_for("m").instance_selection.model_for("llama3-8b-h100")  # type: ignore[attr-defined]
    before = model.theta.copy()
    service.observe_completion(client_end(decision))
    assert not np.array_equal(model.theta, before)
