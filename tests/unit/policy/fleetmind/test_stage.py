"""FleetMind as the DC-selection stage of a Scheduler: home vs divert, sessions, stale telemetry,
gradual return, rejects vs holds, and notices.

Costs with a router without a predictor (least-tokens), input 1000 tokens, rtt 0 unless given:
    cost(d) = rtt(d) + 1000·4 / 1.25e8 + (tokens in flight per ready instance + 1000) / 8000
so an extra X tokens per instance at home costs X / 8000 s; the default divert margin is 0.2 s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from agents.policy.fleetmind.health import unit_hash
from agents.policy.fleetmind.stage import FleetMind
from agents.policy.pools import NO_CAPACITY_POOL
from agents.policy.types import BLOCK_TOKENS, BlocksChanged, ClusterView, RequestView
from tests.unit.policy.fleetmind.helpers import Inst, fleet_view, fleetmind, one, request

DOC: dict[str, Any] = {
    "data_centres": [
        {"name": "A", "region": "eu"},
        {"name": "B", "region": "eu"},
        {"name": "C", "region": "us"},
    ],
    "tenants": {"stay": {"cross_region": False}, "eu-only": {"regions": ["eu"]}},
}
NOW = 1.0


def inst(dc: str, tokens: int = 0, **kwargs: Any) -> Inst:
    kwargs.setdefault("heartbeat_s", NOW)
    return Inst(dc, tokens=tokens, **kwargs)


def dc_reason(rules: Any, req: RequestView, view: ClusterView, now_s: float = NOW, **params: Any) -> str:
    """Why a fresh FleetMind chose its DC (an admit's Outcome.reason is the router's)."""
    return fleetmind(rules, **params).dc_selection.select(req, view, now_s).reason


# --- home or divert -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("home_tokens", "expected"),
    [(0, "A"), (1000, "A"), (1500, "A"), (1700, "B"), (3200, "B")],  # margin 0.2 s = 1600 tokens
)
def test_home_unless_another_dc_is_cheaper_by_more_than_the_margin(home_tokens: int, expected: str) -> None:
    view = fleet_view([inst("A", home_tokens), inst("B")])
    outcome = one(fleetmind(DOC), request("r", home="A"), view, NOW)
    assert (outcome.action, outcome.dc) == ("admit", expected)
    assert outcome.instance_id.startswith(expected)
    reason = dc_reason(DOC, request("r", home="A"), view)
    assert reason.startswith("diverted from A" if expected == "B" else "home data centre")


def test_the_load_compared_is_per_ready_instance() -> None:
    # 2 x 1000 tokens over two instances: 1000 per instance, 0.125 s worse: home.
    view = fleet_view([inst("A", 1000), inst("A", 1000), inst("B")])
    assert one(fleetmind(DOC), request("r", home="A"), view, NOW).dc == "A"
    # Not-ready instances do not count as capacity: 2000 tokens on the one ready instance.
    view = fleet_view([inst("A", 2000), inst("A", 0, ready=False), inst("B")])
    assert one(fleetmind(DOC), request("r", home="A"), view, NOW).dc == "B"


@pytest.mark.parametrize(("rtt_b", "expected"), [(0.25, "A"), (0.1, "B")])
def test_the_round_trip_is_part_of_the_cost(rtt_b: float, expected: str) -> None:
    # Home 0.4 s worse by load; B's round trip eats 0.25 s (0.15 left < margin) or 0.1 s (0.3 > margin).
    view = fleet_view([inst("A", 3200), inst("B")], rtt={"A": 0.0, "B": rtt_b})
    assert one(fleetmind(DOC), request("r", home="A"), view, NOW).dc == expected


def test_the_divert_margin_is_a_parameter() -> None:
    view = fleet_view([inst("A", 3200), inst("B")])
    assert one(fleetmind(DOC, divert_margin_s=0.5), request("r", home="A"), view, NOW).dc == "A"
    assert one(fleetmind(DOC, divert_margin_s=0.3), request("r", home="A"), view, NOW).dc == "B"


def test_a_request_without_a_home_goes_to_the_cheapest_dc() -> None:
    view = fleet_view([inst("A", 800), inst("B", 400), inst("C", 600)])
    assert one(fleetmind(DOC), request("r"), view, NOW).dc == "B"
    assert dc_reason(DOC, request("r"), view).startswith("fallback")


def test_tokenpilot_predictions_decide_the_cost_cache_included() -> None:
    # Both DCs idle; B holds the request's whole 32k-token prefix. The fallback cost sees two
    # equal DCs (home wins); TokenPilot's prediction sees A prefill 32k tokens.
    blocks = tuple(range(100, 164))
    req = request("r", home="A", tokens=len(blocks) * BLOCK_TOKENS, blocks=blocks)
    view = fleet_view([inst("A", kv_total=100_000), inst("B", kv_total=100_000)])
    sched = fleetmind(DOC, router="tokenpilot")
    sched.observe(BlocksChanged("B-0", "stored", blocks, 0.0))
    predicted = sched.instance_selection.predict_rows(req, view, NOW).ttft_s  # type: ignore[attr-defined]
    assert predicted[0] - predicted[1] > 0.2  # precondition: far beyond the margin
    twin = fleetmind(DOC, router="tokenpilot")
    twin.observe(BlocksChanged("B-0", "stored", blocks, 0.0))
    reason = twin.dc_selection.select(req, view, NOW).reason
    transfer = req.input_tokens * 4 / 1.25e8  # bytes per token / bandwidth; rtt 0
    assert (
        reason == f"diverted from A: cost {predicted[1] + transfer:.3f} s vs {predicted[0] + transfer:.3f} s"
    )
    outcome = one(sched, req, view, NOW)
    assert (outcome.dc, outcome.instance_id) == ("B", "B-0")
    plain = fleetmind(DOC)
    plain.observe(BlocksChanged("B-0", "stored", blocks, 0.0))
    assert one(plain, req, view, NOW).dc == "A"


@pytest.mark.parametrize(("home_tokens", "expected"), [(0, "A"), (20_000_000, "B")])
def test_tokenpilot_home_unless_overloaded(home_tokens: int, expected: str) -> None:
    view = fleet_view([inst("A", home_tokens, kv_total=100_000), inst("B", kv_total=100_000)])
    sched = fleetmind(DOC, router="tokenpilot")
    req = request("r", home="A")
    predicted = sched.instance_selection.predict_rows(req, view, NOW).ttft_s  # type: ignore[attr-defined]
    assert (predicted[0] - predicted[1] > 0.2) == (expected == "B")
    assert one(sched, req, view, NOW).dc == expected


def test_a_tenant_without_cross_region_is_never_diverted() -> None:
    view = fleet_view([inst("A", 1_000_000, kv_total=10_000), inst("B"), inst("C")])
    stay = fleetmind(DOC)
    assert one(stay, request("r", "stay", home="A"), view, NOW).dc == "A"
    assert dc_reason(DOC, request("r", "stay", home="A"), view) == "home data centre"
    assert one(fleetmind(DOC), request("r", "t", home="A"), view, NOW).dc == "B"  # control


def test_without_cross_region_a_dead_home_falls_back_within_its_region_only() -> None:
    # A cannot serve; B (eu, loaded) and C (us, idle).
    view = fleet_view([inst("A", ready=False), inst("B", 400_000, kv_total=10_000), inst("C")])
    assert one(fleetmind(DOC), request("r", "stay", home="A"), view, NOW).dc == "B"
    assert one(fleetmind(DOC), request("r", "t", home="A"), view, NOW).dc == "C"
    view = fleet_view([inst("A", ready=False), inst("C")])
    held = one(fleetmind(DOC), request("r", "stay", home="A"), view, NOW)
    assert (held.action, held.pool) == ("queue", NO_CAPACITY_POOL)


def test_never_diverts_into_a_dc_above_the_load_limit() -> None:
    # Home A: load 1e6 / 5.12e6 = 0.2, cost 125 s. B: load 486400 / 512000 = 0.95, cost 61 s.
    view = fleet_view([inst("A", 1_000_000, kv_total=10_000), inst("B", 486_400, kv_total=1000)])
    assert one(fleetmind(DOC), request("r", home="A"), view, NOW).dc == "A"
    assert dc_reason(DOC, request("r", home="A"), view) == "home data centre (other DCs at their load limit)"
    assert one(fleetmind(DOC, load_limit=1.0), request("r", home="A"), view, NOW).dc == "B"


def test_booked_capacity_is_not_free_for_other_tenants_and_is_the_owners_home() -> None:
    doc = {
        **DOC,
        "reservations": [{"tenant": "owner", "model": "m", "instances": 1, "dcs": ["B"]}],
    }
    # B: 500k tokens over 2 x 512k: load 0.49, but 0.98 of the one instance not booked.
    instances = [inst("A", 2_000_000, kv_total=10_000), inst("B", 250_000), inst("B", 250_000)]
    view = fleet_view(instances)
    assert one(fleetmind(DOC), request("r", home="A"), view, NOW).dc == "B"  # no reservation
    sched = fleetmind(doc)
    assert one(sched, request("r", home="A"), view, NOW).dc == "A"
    assert one(sched, request("o", "owner", home="A"), view, NOW).dc == "B"
    assert dc_reason(doc, request("o", "owner", home="A"), view).startswith("home data centre (cost")
    assert [(n.kind, n.tenant, n.dc) for n in sched.notices()] == [("reservation_moved", "owner", "B")]


# --- sessions -------------------------------------------------------------------------------------


def test_a_session_stays_in_the_dc_of_the_prompt_it_continues() -> None:
    sched = fleetmind(DOC)
    view = fleet_view([inst("A"), inst("B")])
    assert one(sched, request("r1", home="B", blocks=(1, 2, 3)), view, NOW).dc == "B"
    cont = sched.dc_selection.select(request("r2", home="A", blocks=(1, 2, 3, 4)), view, NOW)
    assert (cont.dc, cont.reason) == ("B", "session stays where its cache is")
    assert one(sched, request("r3", home="A", blocks=(1, 2, 9)), view, NOW).dc == "A"  # shares 2 blocks only
    assert one(sched, request("r4", home="A", blocks=(1, 2, 3, 4, 5)), view, NOW).dc == "B"  # continues r2
    # One block is no session (a shared system prompt):
    assert one(sched, request("r5", home="B", blocks=(7,)), view, NOW).dc == "B"
    assert one(sched, request("r6", home="A", blocks=(7, 8)), view, NOW).dc == "A"
    # The session's DC cannot serve now: chosen as any other request.
    down = fleet_view([inst("A"), inst("B", ready=False)])
    assert one(sched, request("r7", home="A", blocks=(1, 2, 3, 4, 5, 6)), down, NOW).dc == "A"


def test_a_prefix_continued_in_two_different_ways_is_shared_not_a_session() -> None:
    sched = fleetmind(DOC)
    view = fleet_view([inst("A"), inst("B")])
    assert one(sched, request("doc", home="B", blocks=(1, 2)), view, NOW).dc == "B"
    assert one(sched, request("q1", home="A", blocks=(1, 2, 3)), view, NOW).dc == "B"  # first continuer
    assert one(sched, request("q2", home="A", blocks=(1, 2, 4)), view, NOW).dc == "A"  # another: shared
    assert one(sched, request("q3", home="A", blocks=(1, 2, 3, 5)), view, NOW).dc == "B"  # q1's next turn


def test_a_retried_attempt_does_not_break_its_session() -> None:
    """A chat's turns stay one session; an identical second attempt of turn 1 (a retry) is the
    same conversation, so turn 2 still continues it."""
    sched = fleetmind(DOC)
    view = fleet_view([inst("A"), inst("B")])
    turn1 = request("turn1", home="B", blocks=(1, 2))
    assert one(sched, turn1, view, NOW).dc == "B"
    retry = replace(turn1, attempt=2, home_dc="A")
    assert one(sched, retry, view, NOW).dc == "B"
    assert one(sched, request("turn2", home="A", blocks=(1, 2, 3)), view, NOW).dc == "B"


def test_a_session_is_forgotten_after_its_ttl() -> None:
    sched = fleetmind(DOC, session_ttl_s=5.0)
    assert (
        one(sched, request("r1", home="B", blocks=(1, 2)), fleet_view([inst("A"), inst("B")]), NOW).dc == "B"
    )
    later = fleet_view([inst("A", heartbeat_s=7.0), inst("B", heartbeat_s=7.0)])
    assert one(sched, request("r2", home="A", blocks=(1, 2, 3)), later, 7.0).dc == "A"


# --- stale telemetry --------------------------------------------------------------------------


def test_stale_instances_are_out_of_capacity_and_healthy_dcs_keep_serving() -> None:
    now = 10.0
    view = fleet_view(
        [
            Inst("A", heartbeat_s=9.0),
            Inst("A", heartbeat_s=9.4),  # 0.6 s old: over two 0.25 s intervals
            Inst("B", heartbeat_s=10.0),
            Inst("C", heartbeat_s=8.0),
        ]
    )
    sched = fleetmind(DOC)
    reqs = [
        request("home-a", home="A"),
        request("home-b", home="B"),
        request("home-c", home="C"),
        request("anywhere"),
        request("stay-a", "stay", home="A"),
        request("stay-c", "stay", home="C"),
    ]
    outcomes = {o.request.request_id: o for o in sched.submit(reqs, view, now)}
    for rid in ("home-a", "home-b", "home-c", "anywhere", "stay-a"):
        assert (outcomes[rid].action, outcomes[rid].instance_id) == ("admit", "B-0"), rid
    assert (outcomes["stay-c"].action, outcomes["stay-c"].pool) == ("queue", NO_CAPACITY_POOL)


@pytest.mark.parametrize(("heartbeat_s", "admitted"), [(9.5, True), (9.49, False)])
def test_a_heartbeat_is_fresh_for_two_intervals(heartbeat_s: float, admitted: bool) -> None:
    view = fleet_view([Inst("A", heartbeat_s=heartbeat_s)])
    outcome = one(fleetmind(DOC), request("r", home="A"), view, 10.0)
    assert outcome.action == ("admit" if admitted else "queue")


def test_only_the_fresh_instances_of_a_dc_are_candidates() -> None:
    view = fleet_view([Inst("A", heartbeat_s=0.0), Inst("A", heartbeat_s=1.0), Inst("A", heartbeat_s=1.0)])
    outcomes = fleetmind(DOC).submit([request(f"r{k}", home="A") for k in range(8)], view, 1.0)
    assert {o.instance_id for o in outcomes} == {"A-1", "A-2"}


def test_a_snapshot_goes_stale_as_time_passes_without_a_new_one() -> None:
    view = fleet_view([Inst("A", heartbeat_s=0.0), Inst("B", heartbeat_s=0.4)])
    sched = fleetmind(DOC)
    assert one(sched, request("r1", home="A"), view, 0.3).dc == "A"
    assert one(sched, request("r2", home="A"), view, 0.6).dc == "B"  # A's heartbeat is 0.6 s old
    assert one(sched, request("r3", home="A"), view, 1.0).action == "queue"  # B's too


# --- gradual return ---------------------------------------------------------------------------


def test_a_dc_that_recovers_takes_a_gradually_growing_share_with_one_notice_per_change() -> None:
    sched = fleetmind(DOC, recovery_s=10.0)
    ids = [f"ramp-{k}" for k in range(300)]

    def offer(now_s: float, a_heartbeat_s: float) -> set[str]:
        view = fleet_view([Inst("A", heartbeat_s=a_heartbeat_s), Inst("B", heartbeat_s=now_s)])
        outcomes = sched.submit([request(rid, home="A") for rid in ids], view, now_s)
        assert all(o.action == "admit" for o in outcomes)
        return {o.request.request_id for o in outcomes if o.dc == "A"}

    assert offer(0.0, 0.0) == set(ids)
    assert sched.notices() == []
    assert offer(1.0, 0.0) == set()  # A stale: down
    assert [(n.kind, n.dc) for n in sched.notices()] == [("dc_down", "A")]
    assert offer(2.0, 2.0) == set()  # back, recovering since 2.0: share 0
    assert [(n.kind, n.dc) for n in sched.notices()] == [("dc_recovering", "A")]
    quarter, half = offer(4.5, 4.5), offer(7.0, 7.0)
    assert quarter == {rid for rid in ids if unit_hash(rid) < 0.25}
    assert half == {rid for rid in ids if unit_hash(rid) < 0.5}
    assert 0 < len(quarter) < len(half) < len(ids) and quarter <= half
    assert sched.notices() == []
    assert offer(12.5, 12.5) == set(ids)
    assert [(n.kind, n.dc) for n in sched.notices()] == [("dc_up", "A")]
    assert sched.notices() == []


def test_notices_are_drained_once() -> None:
    sched = fleetmind(DOC)
    sched.submit([request("r0", home="A")], fleet_view([Inst("A"), Inst("B")]), 0.0)
    sched.submit([request("r1", home="A")], fleet_view([Inst("A"), Inst("B", heartbeat_s=1.0)]), 1.0)
    (notice,) = sched.notices()
    assert (notice.kind, notice.dc, notice.model, notice.model_version, notice.time_s) == (
        "dc_down", "A", "m", "", 1.0,
    )  # fmt: skip
    assert sched.notices() == []


# --- rejects and holds ----------------------------------------------------------------------------


def rejects_view() -> Any:
    return fleet_view(
        [
            inst("A"),  # m v1, ready
            inst("B", ready=False),  # m v1, deployed, not ready
            inst("C", model="n"),  # n v1, only in the us
        ]
    )


@pytest.mark.parametrize(
    ("req", "code"),
    [
        (request("r", "eu-only", model="n"), "not_permitted"),
        (request("r", model="n", regions=("A", "B")), "not_permitted"),
        (request("r", "stay", model="n", home="A"), "not_permitted"),
        (request("r", version="v9"), "no_version"),
        (request("r", model="zz"), "no_version"),
    ],
)
def test_a_request_no_allowed_dc_could_ever_serve_is_rejected_at_once(req: Any, code: str) -> None:
    view = rejects_view()
    choice = FleetMind(rules=DOC).select(req, view, NOW)
    assert choice.reject and choice.reason.startswith(code) and not choice.candidates.any()
    sched = fleetmind(DOC)
    outcome = one(sched, req, view, NOW)
    assert (outcome.action, outcome.reason.split(":")[0]) == ("reject", code)
    assert sched.held_total == 0


def test_a_pinned_version_that_is_not_deployed_is_no_version() -> None:
    outcome = one(fleetmind({**DOC, "models": {"m": {"version": "v3"}}}), request("r"), rejects_view(), NOW)
    assert (outcome.action, outcome.reason.split(":")[0]) == ("reject", "no_version")
    assert "m version v3" in outcome.reason


def test_deployed_but_not_ready_is_held_then_routed() -> None:
    sched = fleetmind(DOC)
    req = request("r", regions=("B",))
    choice = FleetMind(rules=DOC).select(req, rejects_view(), NOW)
    assert not choice.reject and choice.reason.startswith("no_capacity") and not choice.candidates.any()
    held = one(sched, req, rejects_view(), NOW)
    assert (held.action, held.pool, held.reason.split(":")[0]) == ("queue", NO_CAPACITY_POOL, "no_capacity")
    # B never served before: it has no traffic to give back gradually, so it serves at once.
    (routed,) = sched.tick(fleet_view([inst("A"), inst("B", heartbeat_s=1.5)]), 1.5)
    assert (routed.action, routed.dc) == ("admit", "B")


def test_candidates_are_the_ready_fresh_rows_of_the_model_version_in_the_chosen_dc() -> None:
    view = fleet_view(
        [
            inst("A"),  # yes
            inst("A", version="v2"),  # another version
            inst("A", ready=False),
            inst("A", heartbeat_s=0.0),  # stale
            inst("A", model="n"),
            inst("B"),  # another DC
            inst("A"),  # yes
        ]
    )
    choice = FleetMind(rules=DOC).select(request("r", version="v1", home="A"), view, NOW)
    assert choice.dc == "A" and list(np.flatnonzero(choice.candidates)) == [0, 6]
    pinned = FleetMind(rules={**DOC, "models": {"m": {"version": "v2"}}})
    choice = pinned.select(request("r", home="A"), view, NOW)
    assert choice.dc == "A" and list(np.flatnonzero(choice.candidates)) == [1]


def test_an_unreachable_dc_is_skipped_for_a_reachable_one() -> None:
    view = fleet_view([inst("A"), inst("B", 50_000)], unreachable=["A"])
    outcome = one(fleetmind(DOC), request("r", home="A"), view, NOW)
    assert (outcome.action, outcome.dc) == ("admit", "B")


def test_losing_contact_with_the_only_dc_holds_the_request_rather_than_rejecting_it() -> None:
    """Contact loss is temporary (DcView: the DC's instances are then not candidates); the
    rules do not forbid the DC, so the request is held (DcChoice: reject only when no allowed
    DC could *ever* serve it) and routed once the DC is reachable again."""
    sched = fleetmind(DOC)
    outcome = one(sched, request("r", home="A"), fleet_view([inst("A")], unreachable=["A"]), NOW)
    assert (outcome.action, outcome.pool) == ("queue", NO_CAPACITY_POOL), outcome.reason
    (routed,) = sched.tick(fleet_view([inst("A", heartbeat_s=1.5)]), 1.5)
    assert (routed.action, routed.dc) == ("admit", "A")
