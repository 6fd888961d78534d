"""PlacementAdvisor: replica advice from a sustained mismatch of demand and capacity."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agents.policy.fleetmind.advice import PlacementAdvisor
from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.fleetmind.rules import parse_rules
from agents.policy.types import empty_view
from tests.unit.policy.fleetmind.helpers import Inst, capacity, fleet_view, fleetmind, request

RTT = {"A": 0.05, "B": 0.01, "C": 0.02, "D": 0.03}


def rules(budget: int = 10, slots: dict[str, int] | None = None, extra: Iterable[dict[str, Any]] = ()) -> Any:
    slots = {"A": 4, "B": 4, "C": 4, **(slots or {})}
    return parse_rules(
        {
            "data_centres": [
                {"name": "A", "failure_domain": "fd1", "gpu_slots": slots["A"]},
                {"name": "B", "failure_domain": "fd1", "gpu_slots": slots["B"]},
                {"name": "C", "failure_domain": "fd2", "gpu_slots": slots["C"]},
                *extra,
            ],
            "gpu_budget": budget,
        }
    )


def fleet(load: float, deployed: dict[str, int] | None = None) -> dict[str, DcCapacity]:
    """Every DC at ``load`` (tokens in flight / token capacity, 1000 tokens per instance)."""
    deployed = deployed or {"A": 3, "B": 1, "C": 2}  # fd1 holds 4, fd2 holds 2
    return {dc: capacity(dc, n, tokens=round(load * n * 1000)) for dc, n in deployed.items()}


def feed(advisor: PlacementAdvisor, caps: dict[str, DcCapacity], times: Iterable[float]) -> list[FleetNotice]:
    return [notice for t in times for notice in advisor.sample("m", "v1", caps, t)]


def advisor(**kwargs: Any) -> PlacementAdvisor:
    return PlacementAdvisor(rules(**kwargs), RTT.__getitem__, window_s=60.0, sample_s=1.0)


def test_no_advice_without_a_gpu_budget() -> None:
    adv = advisor(budget=0)
    assert feed(adv, fleet(0.95), range(0, 200)) == []
    assert feed(adv, fleet(0.05), range(200, 400)) == []


def test_no_advice_before_a_full_window_of_evidence() -> None:
    adv = advisor()
    assert feed(adv, fleet(0.95), range(0, 57)) == []  # 0 .. 56 s: under 95 % of the 60 s window
    (notice,) = feed(adv, fleet(0.95), [58.0])
    assert notice.time_s == 58.0


def test_sustained_high_load_adds_one_in_the_failure_domain_with_fewest_instances() -> None:
    notices = feed(advisor(), fleet(0.9), range(0, 59))
    assert [(n.kind, n.dc, n.delta, n.model, n.model_version) for n in notices] == [
        ("replica_advice", "C", 1, "m", "v1")
    ]
    assert "6 of a 10-instance budget" in notices[0].detail
    assert notices[0].replicas == 3  # C runs 2: the advice asks for 3 there


def test_a_dc_without_the_model_counts_as_an_empty_failure_domain() -> None:
    extra = [{"name": "D", "failure_domain": "fd3", "gpu_slots": 1}]
    (notice,) = feed(advisor(extra=extra), fleet(0.9), range(0, 59))
    assert (notice.dc, notice.delta, notice.replicas) == ("D", 1, 1)


def test_growth_needs_a_free_slot_and_breaks_domain_ties_by_rtt() -> None:
    # C is full (2 slots, 2 deployed): fd1's A and B tie on domain count; B is nearer.
    (notice,) = feed(advisor(slots={"C": 2}), fleet(0.9), range(0, 59))
    assert notice.dc == "B"
    assert feed(advisor(slots={"A": 3, "B": 1, "C": 2}), fleet(0.9), range(0, 200)) == []  # all full


def test_growth_stays_within_the_budget() -> None:
    assert feed(advisor(budget=6), fleet(0.9), range(0, 200)) == []  # 6 deployed of 6
    assert [n.delta for n in feed(advisor(budget=7), fleet(0.9), range(0, 59))] == [1]


def test_sustained_low_load_removes_one_where_most_instances_are() -> None:
    (notice,) = feed(advisor(), fleet(0.1), range(0, 59))
    assert (notice.kind, notice.dc, notice.delta, notice.replicas) == ("replica_advice", "A", -1, 2)


def test_shrinking_never_removes_the_last_instance_of_a_failure_domain() -> None:
    assert feed(advisor(), fleet(0.1, {"A": 1, "C": 1}), range(0, 200)) == []
    (notice,) = feed(advisor(), fleet(0.1, {"A": 1, "B": 1, "C": 1}), range(0, 59))
    assert (notice.dc, notice.delta) == ("B", -1)  # fd1 keeps A; C is fd2's only one
    assert feed(advisor(), fleet(0.1, {"A": 1}), range(0, 200)) == []  # a single instance


def test_middling_load_gives_no_advice() -> None:
    adv = advisor()
    assert feed(adv, fleet(0.5), range(0, 200)) == []
    # 0.9 and 0.1 by turns, 5 s each: every 60 s window has a mean between 0.44 and 0.56.
    mixed = [n for t in range(200, 400) for n in adv.sample("m", "v1", fleet(0.9 if t // 5 % 2 else 0.1), t)]
    assert mixed == []


def test_the_window_starts_again_after_advice() -> None:
    adv = advisor()
    (first,) = feed(adv, fleet(0.9), range(0, 58))
    assert first.time_s == 57.0  # 0 .. 57 s: 95 % of the window
    assert feed(adv, fleet(0.9), range(58, 115)) == []  # a new window from 58 s: not full at 114 s
    (again,) = feed(adv, fleet(0.9), [116.0])
    assert (again.dc, again.time_s) == ("C", 116.0)


def test_samples_are_taken_once_per_sample_interval() -> None:
    adv = advisor()
    # Calls every 0.5 s: only one in two is a sample, so the window is full at the same time.
    halves = [k / 2 for k in range(0, 114)]  # 0 .. 56.5 s
    assert feed(adv, fleet(0.9), halves) == []
    assert len(feed(adv, fleet(0.9), [58.0])) == 1


def _advice_through_the_stage(first_view_empty: bool) -> list[FleetNotice]:
    """C runs both its slots of m at 95 % load; A (rtt 0.3 s) and B (rtt 0.01 s) are empty
    failure domains with free slots: advice must name the nearer one, B."""
    doc = {
        "data_centres": [
            {"name": "A", "failure_domain": "fa", "gpu_slots": 2},
            {"name": "B", "failure_domain": "fb", "gpu_slots": 2},
            {"name": "C", "failure_domain": "fc", "gpu_slots": 2},
        ],
        "gpu_budget": 10,
    }
    sched = fleetmind(doc)
    rtt = {"A": 0.3, "B": 0.01, "C": 0.0}
    busy = round(0.95 * 1000 * 512)
    if first_view_empty:
        sched.submit([request("early", home="C")], empty_view(version=1), 0.0)
    advice = []
    for t in range(1, 63):
        view = fleet_view([Inst("C", tokens=busy, heartbeat_s=t)] * 2, rtt=rtt)
        sched.submit([request(f"r{t}", home="C")], view, float(t))
        advice += [n for n in sched.notices() if n.kind == "replica_advice"]
    return advice


def test_the_stage_advises_the_nearest_dc_of_the_emptiest_failure_domains() -> None:
    assert [(n.dc, n.delta) for n in _advice_through_the_stage(first_view_empty=False)] == [("B", 1)]


def test_advice_uses_the_current_rtt_not_the_first_snapshots() -> None:
    # The service's first snapshot is typically empty (no heartbeat yet): no RTT is known then.
    assert [(n.dc, n.delta) for n in _advice_through_the_stage(first_view_empty=True)] == [("B", 1)]
