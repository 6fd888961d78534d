"""DcHealth: up -> down -> recovering -> up, the linear ramp, stable admission, one notice per change."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.fleetmind.capacity import aggregate
from agents.policy.fleetmind.health import DcHealth, unit_hash
from tests.unit.policy.fleetmind.helpers import Inst, capacity, fleet_view

KEY = ("m", "v1")


def kinds(health: DcHealth, ready: int, now_s: float, dc: str = "A") -> list[tuple[str, str]]:
    notices = health.update(*KEY, {dc: capacity(dc, ready, deployed=2)}, now_s)
    return [(n.kind, n.dc) for n in notices]


def test_a_dc_never_seen_is_up_with_its_full_share() -> None:
    health = DcHealth(recovery_s=10.0)
    assert health.state("A", *KEY) == "up" and health.share("A", *KEY, 0.0) == 1.0


def test_first_sight_sets_the_state_without_a_notice() -> None:
    health = DcHealth(recovery_s=10.0)
    notices = health.update(*KEY, {"A": capacity("A", 2), "B": capacity("B", 0, deployed=2)}, 0.0)
    assert notices == []
    assert (health.state("A", *KEY), health.state("B", *KEY)) == ("up", "down")


def test_up_goes_down_when_no_ready_fresh_instance_remains_and_only_once() -> None:
    health = DcHealth(recovery_s=10.0)
    assert kinds(health, 2, 0.0) == []
    assert kinds(health, 1, 1.0) == []  # one of two left: still up
    assert kinds(health, 0, 2.0) == [("dc_down", "A")]
    assert health.state("A", *KEY) == "down" and health.share("A", *KEY, 2.0) == 0.0
    assert kinds(health, 0, 3.0) == []  # no second notice for the same state


def test_stale_heartbeats_make_a_ready_instance_no_capacity() -> None:
    # Two heartbeat intervals of 0.25 s: stale after 0.5 s.
    view = fleet_view([Inst("A", heartbeat_s=0.0), Inst("A", heartbeat_s=0.5), Inst("B", heartbeat_s=0.0)])
    caps = aggregate(view, "m", "v1", 1.0, 0.5)
    assert (caps["A"].ready, caps["A"].deployed) == (1, 2)
    assert list(caps["A"].rows) == [False, True, False]
    assert (caps["B"].ready, caps["B"].deployed) == (0, 1)
    health = DcHealth(recovery_s=10.0)
    health.update("m", "v1", aggregate(view, "m", "v1", 0.4, 0.5), 0.4)  # all fresh at 0.4
    notices = health.update("m", "v1", caps, 1.0)
    assert [(n.kind, n.dc) for n in notices] == [("dc_down", "B")]
    assert health.state("A", "m", "v1") == "up"


def test_down_recovers_then_is_up_after_recovery_s_with_one_notice_each() -> None:
    health = DcHealth(recovery_s=10.0)
    kinds(health, 2, 0.0)
    assert kinds(health, 0, 1.0) == [("dc_down", "A")]
    assert kinds(health, 1, 5.0) == [("dc_recovering", "A")]
    assert kinds(health, 2, 6.0) == []
    assert kinds(health, 2, 14.9) == []  # 9.9 s into the ramp
    assert health.state("A", *KEY) == "recovering"
    assert kinds(health, 2, 15.0) == [("dc_up", "A")]
    assert health.state("A", *KEY) == "up" and health.share("A", *KEY, 15.0) == 1.0
    assert kinds(health, 2, 16.0) == []


def test_recovering_falls_back_down_when_none_is_ready_again() -> None:
    health = DcHealth(recovery_s=10.0)
    kinds(health, 2, 0.0)
    kinds(health, 0, 1.0)
    kinds(health, 2, 2.0)
    assert kinds(health, 0, 3.0) == [("dc_down", "A")]
    assert kinds(health, 2, 4.0) == [("dc_recovering", "A")]
    assert health.share("A", *KEY, 6.5) == pytest.approx(0.25)  # the ramp starts again at 4.0


def test_the_ramp_share_grows_linearly_to_one() -> None:
    health = DcHealth(recovery_s=8.0)
    kinds(health, 1, 0.0)
    kinds(health, 0, 1.0)
    kinds(health, 1, 2.0)  # recovering since 2.0
    times = [2.0, 3.0, 4.0, 6.0, 9.0, 10.0, 30.0]
    shares = [health.share("A", *KEY, t) for t in times]
    assert shares == pytest.approx([0.0, 0.125, 0.25, 0.5, 0.875, 1.0, 1.0])


def test_the_notice_names_the_dc_model_version_and_the_counts() -> None:
    health = DcHealth(recovery_s=10.0)
    health.update("m", "v3", {"A": capacity("A", 3)}, 0.0)
    (notice,) = health.update("m", "v3", {"A": capacity("A", 0, deployed=3)}, 2.5)
    assert (notice.kind, notice.dc, notice.model, notice.model_version, notice.time_s) == (
        "dc_down", "A", "m", "v3", 2.5,
    )  # fmt: skip
    assert "0 of 3" in notice.detail


def test_state_is_per_dc_model_and_version() -> None:
    health = DcHealth(recovery_s=10.0)
    health.update("m", "v1", {"A": capacity("A", 1)}, 0.0)
    health.update("m", "v1", {"A": capacity("A", 0, deployed=1)}, 1.0)
    assert health.state("A", "m", "v1") == "down"
    assert health.state("A", "m", "v2") == "up" and health.state("A", "n", "v1") == "up"
    assert health.state("B", "m", "v1") == "up"


def test_lets_in_is_the_share_of_request_ids_and_stable_per_request() -> None:
    health = DcHealth(recovery_s=10.0)
    kinds(health, 1, 0.0)
    kinds(health, 0, 1.0)
    kinds(health, 1, 10.0)  # recovering since 10
    ids = [f"req-{k}" for k in range(4000)]
    let_in: dict[float, set[str]] = {}
    for t, share in ((10.0, 0.0), (12.5, 0.25), (15.0, 0.5), (17.5, 0.75)):
        now_in = {rid for rid in ids if health.lets_in("A", *KEY, rid, t)}
        assert now_in == {rid for rid in ids if unit_hash(rid) < share}
        assert abs(len(now_in) / len(ids) - share) < 0.03
        again = {rid for rid in ids if health.lets_in("A", *KEY, rid, t)}
        assert again == now_in  # the same answer on every offer
        for earlier in let_in.values():
            assert earlier <= now_in  # once let in, let in for the rest of the ramp
        let_in[t] = now_in
    assert all(health.lets_in("A", *KEY, rid, 20.0) for rid in ids)


def test_unit_hash_is_stable_and_in_the_unit_interval() -> None:
    values = np.array([unit_hash(f"x{k}") for k in range(1000)])
    assert ((values >= 0.0) & (values < 1.0)).all()
    assert unit_hash("abc") == unit_hash("abc") != unit_hash("abd")
