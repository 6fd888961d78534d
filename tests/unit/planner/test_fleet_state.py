"""The topics folded into the planners' ``FleetState`` (``planner/fleet_state.py``): pools from the
newest heartbeats, budgets and staged weights from the fleet file and the plans, demand per
window from requests, admissions and completions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agents.policy.planners.contract import DemandSample, FleetState, PoolState
from planner.fleet_state import KV_BLOCK_TOKENS, FleetFacts, FleetFold, fleet_facts
from schemas.events import AdmissionDecision, Completion, Heartbeat, InferenceRequest, ReplicaPlan

GPUS = {"small": 1, "big": 4}

DOC: dict[str, Any] = {
    "data_centres": [
        {"name": "A", "region": "eu", "failure_domain": "eu-1", "gpus": 16, "warm_capacity": 2,
         "warm_models": ["m"]},
        {"name": "B", "region": "us", "instances": [{"count": 3, "profile": "small", "model": "m"}]},
        {"name": "C"},
    ],
    "models": {
        "m": {"version": "2", "load_s": {"cold": 120, "warm": 20}, "min_replicas": 1},
        "n": {"profile": "big", "load_s": {"cold": 300}},
    },
}  # fmt: skip


def facts(doc: dict[str, Any] | None = None) -> FleetFacts:
    return fleet_facts(DOC if doc is None else doc, lambda name: GPUS[name])


def fold(**options: Any) -> FleetFold:
    return FleetFold(facts(), lambda c: c.status == "ok" and (c.ttft_s or 9.0) <= 1.0, **options)


def beat(instance: str, ts: float, *, dc: str = "A", model: str = "m", **fields: Any) -> Heartbeat:
    values: dict[str, Any] = {
        "model_version": "2", "waiting": 0, "running": 0, "tokens_in_flight": 0, "kv_blocks_used": 0,
        "kv_blocks_total": 100, **fields,
    }  # fmt: skip
    return Heartbeat(instance_id=instance, dc=dc, model=model, ts=ts, **values)


def request(rid: str, ts: float, **fields: Any) -> InferenceRequest:
    values: dict[str, Any] = {
        "model": "m", "input_tokens": 100, "output_budget": 10, "home_dc": "A", **fields,
    }  # fmt: skip
    return InferenceRequest(request_id=rid, ts=ts, **values)


def admission(rid: str, ts: float, action: Any, model: str = "m") -> AdmissionDecision:
    return AdmissionDecision(
        request_id=rid, ts=ts, model=model, slo_class="interactive", action=action, policy="p"
    )


def completion(rid: str, ts: float, attempt: int = 1, ttft_s: float = 0.5, model: str = "m") -> Completion:
    return Completion(
        request_id=rid, attempt=attempt, ts=ts, instance_id="i", model=model, status="ok", arrival_ts=ts - 1,
        ttft_s=ttft_s, e2e_s=1.0, input_tokens=100, output_tokens=7,
    )  # fmt: skip


def only(state: FleetState) -> DemandSample:
    (sample,) = state.demand
    return sample


# -- the fleet file -----------------------------------------------------------------------------


def test_the_fleet_file_gives_budgets_staged_models_load_times_and_listed_gpus() -> None:
    found = facts()
    assert found.listed_gpus == {"B": 3}  # three one-GPU instances
    assert found.model_gpus == {"m": 1, "n": 4}  # the listed group's profile, the model's profile
    assert found.engines == {("m", "1"): "small", ("n", ""): "big"}  # a group's version defaults to "1"
    assert found.shape.dc("A").gpus == 16 and found.shape.dc("A").warm_models == ("m",)
    assert found.shape.model("m").cold_s == 120 and found.shape.model("m").min_replicas == 1
    assert found.rules.versions == {"m": "2"} and found.rules.dcs["A"].failure_domain == "eu-1"


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"data_centres": [{"name": "A", "instances": [{"count": 0, "profile": "small"}]}]}, "count"),
        ({"data_centres": [{"name": "A", "instances": [{"profile": "tiny"}]}]}, "tiny"),
        ({"data_centres": [{"name": "A", "instances": [{"count": 1}]}]}, "profile"),
        ({"data_centres": [{"name": "A", "warm_capacity": 0, "warm_models": ["m"]}]}, "warm_capacity"),
    ],
)
def test_a_bad_fleet_file_is_one_line_naming_the_key(doc: dict[str, Any], says: str) -> None:
    def gpus(name: str) -> int:
        if name not in GPUS:
            raise ValueError(f"unknown engine profile {name!r}")
        return GPUS[name]

    with pytest.raises(ValueError, match=says) as caught:
        fleet_facts(doc, gpus)
    assert "\n" not in str(caught.value)


# -- heartbeats -----------------------------------------------------------------------------------


def test_pools_count_ready_loading_and_draining_and_sum_the_ready_ones_load() -> None:
    f = fold()
    f.heartbeat(beat("r1", 10.0, waiting=2, running=3, tokens_in_flight=500, kv_blocks_used=50))
    f.heartbeat(beat("r2", 10.0, waiting=1, running=1, tokens_in_flight=100, kv_blocks_used=10))
    f.heartbeat(beat("l1", 10.0, endpoint_ready=False, running=9))
    f.heartbeat(beat("d1", 10.0, draining=True, waiting=7, running=7, kv_blocks_used=90))
    f.heartbeat(beat("b1", 10.0, dc="B", gpus=2))
    state = f.snapshot(11.0)
    pool = state.pool("m", "2", "A")
    assert dataclasses.replace(pool, kv_usage=0.0) == PoolState(
        "m", "2", "A", ready=2, loading=1, draining=1, waiting=3, running=4, tokens_in_flight=600
    )
    assert pool.kv_usage == pytest.approx(0.3)  # the mean over the ready ones: (0.5 + 0.1) / 2
    assert state.pool("m", "2", "B").ready == 1
    used = {dc.name: dc.gpus_used for dc in state.dcs}
    assert used == {"A": 4, "B": 2, "C": 0}  # every live instance holds its GPUs, draining ones too


def test_the_newest_beat_wins_and_a_silent_instance_has_stopped() -> None:
    f = fold(stale_s=5.0)
    f.heartbeat(beat("i1", 10.0, endpoint_ready=False))
    f.heartbeat(beat("i1", 12.0))
    f.heartbeat(beat("i1", 11.0, endpoint_ready=False))  # late, older: ignored
    f.heartbeat(beat("i2", 10.0))
    assert f.snapshot(14.0).pool("m", "2", "A").ready == 2
    state = f.snapshot(16.5)  # i2 silent for 6.5 s, i1 for 4.5 s
    assert state.pool("m", "2", "A").ready == 1
    assert {dc.name: dc.gpus_used for dc in state.dcs}["A"] == 1


def test_dc_budgets_come_from_the_file_then_the_listed_instances_then_the_peak_held() -> None:
    f = fold()
    for i in range(3):
        f.heartbeat(beat(f"c{i}", 10.0, dc="C", gpus=2))
    f.heartbeat(beat("x1", 10.0, dc="X"))
    f.snapshot(10.0)
    f.heartbeat(beat("c0", 20.0, dc="C", gpus=2))  # the others stopped
    state = f.snapshot(20.0)
    dcs = {dc.name: dc for dc in state.dcs}
    assert [dc.name for dc in state.dcs] == ["A", "B", "C", "X"]  # the file's order, then new ones
    assert (dcs["A"].gpus, dcs["B"].gpus, dcs["C"].gpus) == (16, 3, 6)
    assert (dcs["C"].gpus_used, dcs["X"].region, dcs["X"].failure_domain) == (2, "X", "X")
    assert (dcs["A"].region, dcs["A"].failure_domain, dcs["A"].warm_capacity) == ("eu", "eu-1", 2)


def test_staged_models_are_the_files_until_a_plan_names_others() -> None:
    f = fold()
    assert {dc.name: dc.warm for dc in f.snapshot(1.0).dcs}["A"] == ("m",)
    f.plan(ReplicaPlan(planner="p", model="n", dc="A", replicas=1, warm=("n", "m")))
    f.plan(ReplicaPlan(planner="p", model="n", dc="B", replicas=1))  # None: the set is unchanged
    warm = {dc.name: dc.warm for dc in f.snapshot(2.0).dcs}
    assert warm == {"A": ("n", "m"), "B": (), "C": ()}


def test_models_come_from_the_heartbeats_and_the_file_with_gpus_kv_load_times_and_floors() -> None:
    f = fold()
    f.heartbeat(beat("i1", 1.0, gpus=2, kv_blocks_total=300))
    f.heartbeat(beat("i2", 1.0, model="o", model_version="7"))
    specs = {(s.model, s.version): s for s in f.snapshot(1.0).models}
    assert set(specs) == {("m", "2"), ("n", ""), ("o", "7")}
    m, n, o = specs[("m", "2")], specs[("n", "")], specs[("o", "7")]
    assert (m.gpus, m.kv_tokens, m.load_cold_s, m.load_warm_s, m.min_replicas) == (
        2, 300 * KV_BLOCK_TOKENS, 120, 20, 1,
    )  # fmt: skip
    assert (n.gpus, n.load_cold_s, n.load_warm_s, n.kv_tokens) == (4, 300, 300, 0)  # its profile; no beat
    assert (o.gpus, o.min_replicas) == (1, 0)


def test_the_kv_size_is_the_largest_a_beat_said_and_the_links_are_the_settings() -> None:
    f = fold(kv_link_gbps={"A": 400.0, "Z": 10.0})
    f.heartbeat(beat("i1", 1.0, kv_bytes_per_token=131_072))
    f.heartbeat(beat("i2", 1.0, kv_bytes_per_token=0))  # an instance that does not know it
    f.heartbeat(beat("i3", 1.0, model="o", model_version="7"))
    state = f.snapshot(1.0)
    specs = {(s.model, s.version): s.kv_bytes_per_token for s in state.models}
    assert specs == {("m", "2"): 131_072, ("n", ""): 0, ("o", "7"): 0}
    links = {dc.name: dc.kv_link_gbps for dc in state.dcs}
    assert links == {"A": 400.0, "B": 0.0, "C": 0.0}  # a link for a DC the fleet has not: no DC


# -- demand ---------------------------------------------------------------------------------------


def test_demand_counts_first_attempts_once_per_model_version_and_home_dc() -> None:
    f = fold()
    f.heartbeat(beat("i1", 1.0, model="o", model_version="7"))
    f.request(request("r1", 1.0, input_tokens=100, output_budget=10))
    f.request(request("r1", 1.5))  # a resend of the same request: not new demand
    f.request(request("r1", 2.0, attempt=2))  # a retry: not new demand
    f.request(request("r2", 2.0, home_dc="B", model_version="3"))
    f.request(request("r3", 2.0, model="o", home_dc=""))  # the one version the heartbeats show
    f.request(request("r4", 2.0, model="q"))  # unknown model, no version anywhere
    state = f.snapshot(5.0)
    by_key = {(d.model, d.version, d.home_dc): d for d in state.demand}
    assert set(by_key) == {("m", "2", "A"), ("m", "3", "B"), ("o", "7", ""), ("q", "", "A")}
    first = by_key[("m", "2", "A")]
    assert (first.arrivals, first.input_tokens, first.output_budget) == (1, 100, 10)
    assert (first.start_s, first.end_s) == (1.0, 5.0)  # the first window starts at the first demand
    assert first.rate_per_s == pytest.approx(0.25)


def test_admissions_count_a_request_held_once_and_rejected_once_under_its_key() -> None:
    f = fold()
    f.request(request("r1", 1.0, home_dc="B"))
    for action in ("queue", "queue", "admit", "reject", "reject"):
        f.admission(admission("r1", 2.0, action))
    f.admission(admission("gone", 2.0, "reject"))  # its request came before: the model's key, no home
    by_key = {(d.model, d.version, d.home_dc): d for d in f.snapshot(3.0).demand}
    assert (by_key[("m", "2", "B")].held, by_key[("m", "2", "B")].rejected) == (1, 1)
    assert (by_key[("m", "2", "")].arrivals, by_key[("m", "2", "")].rejected) == (0, 1)


def test_completions_count_each_attempt_once_with_tokens_and_the_slo_judgement() -> None:
    f = fold()
    f.request(request("r1", 1.0))
    f.request(request("r2", 1.0))
    f.completion(completion("r1", 2.0, ttft_s=0.5))
    f.completion(completion("r1", 2.0, ttft_s=0.5))  # redelivered
    f.completion(completion("r2", 2.0, ttft_s=3.0))  # late: no SLO
    f.completion(completion("r2", 3.0, attempt=2, ttft_s=0.2))  # its retry, met
    sample = only(f.snapshot(4.0))
    assert (sample.arrivals, sample.completed, sample.met_slo) == (2, 3, 2)
    assert (sample.output_tokens, sample.completed_input_tokens) == (21, 300)


def test_each_snapshot_closes_its_window_and_opens_the_next() -> None:
    f = fold()
    f.open_window(0.0)
    f.request(request("r1", 1.0))
    assert only(f.snapshot(10.0)).arrivals == 1
    f.request(request("r2", 12.0))
    f.request(request("r3", 13.0))
    sample = only(f.snapshot(20.0))
    assert (sample.start_s, sample.end_s, sample.arrivals) == (10.0, 20.0, 2)
    assert f.snapshot(30.0).demand == ()


def test_a_request_is_remembered_for_memory_s_and_at_most_max_requests() -> None:
    f = fold(memory_s=100.0, max_requests=2)
    f.request(request("r1", 0.0))
    f.request(request("r2", 50.0))
    f.request(request("r3", 60.0))  # over the bound: r1 is forgotten
    f.snapshot(120.0)  # r2 is now 70 s old, kept; r3 60 s
    assert f.requests_remembered == 2
    f.snapshot(155.0)  # r2 105 s old: forgotten
    assert f.requests_remembered == 1
    f.request(request("r2", 156.0))  # forgotten, so counted again: a late resend is demand again
    assert only(f.snapshot(160.0)).arrivals == 1


def test_the_same_events_and_instants_give_the_same_states() -> None:
    """Nothing but the events' timestamps and the instants given: a planner that replays the
    topics sees what the one that read them live saw."""
    plan = ReplicaPlan(planner="p", model="m", model_version="2", dc="A", replicas=2, warm=("m",), ts=3.5)
    events: list[Any] = [
        beat("i1", 1.0), request("r1", 1.5), admission("r1", 1.6, "queue"),
        beat("i2", 2.0, endpoint_ready=False), completion("r1", 3.0), plan, request("r2", 4.0, home_dc="C"),
        beat("i1", 6.0, draining=True),
    ]  # fmt: skip
    states = []
    for _ in range(2):
        f = fold()
        f.open_window(0.0)
        taken = []
        for event in events:
            f.add(event)
            if event.ts in (2.0, 4.0):
                taken.append(f.snapshot(event.ts + 0.5))
        taken.append(f.snapshot(8.0))
        states.append(taken)
    assert states[0] == states[1]
    assert [len(s.demand) for s in states[0]] == [1, 2, 0]
    last = states[0][-1].pool("m", "2", "A")
    assert (last.draining, last.loading) == (1, 0)  # i2 was silent for 6 s: stopped
