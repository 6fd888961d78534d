"""The scheduler pipeline: holds, re-offers on a new snapshot, rejects, withdraws, in order."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from agents.policy.baselines import LeastTokens, RoundRobin
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.pipeline import Scheduler
from agents.policy.pools import DEFERRED_POOL, NO_CAPACITY_POOL
from agents.policy.types import Admission, ClusterView, Observation, RequestView, empty_view
from tests.unit.policy.helpers import cluster_view


def req(rid: str, model: str = "m", **kwargs: object) -> RequestView:
    return RequestView(rid, 1, "t", model, "interactive", 1024, 64, (), 0.0, **kwargs)  # type: ignore[arg-type]


def scheduler(admission: object | None = None) -> Scheduler:
    return Scheduler("test", admission or PassThrough(), HomeDc(), RoundRobin())  # type: ignore[arg-type]


def test_a_request_without_capacity_is_held_once_and_routed_on_the_next_snapshot() -> None:
    s = scheduler()
    (held,) = s.submit([req("a")], empty_view(), 0.0)
    assert (held.action, held.pool) == ("queue", NO_CAPACITY_POOL)
    assert s.held() == {NO_CAPACITY_POOL: 1}
    assert s.tick(empty_view(), 0.1) == []  # same snapshot version: not offered again
    still_empty = empty_view(version=7)
    assert s.tick(still_empty, 0.2) == []  # offered again, still no room: no new outcome
    (routed,) = s.tick(cluster_view(2), 0.3)
    assert (routed.action, routed.request.request_id, routed.instance_id) == ("admit", "a", "i0")
    assert s.held_total == 0 and s.tick(cluster_view(2), 0.4) == []


def test_held_requests_leave_in_arrival_order() -> None:
    s = scheduler()
    s.submit([req("a"), req("b")], empty_view(), 0.0)
    s.submit([req("c")], empty_view(), 0.1)
    assert [o.request.request_id for o in s.tick(cluster_view(3), 1.0)] == ["a", "b", "c"]


def test_with_several_deciders_a_long_prompt_waits_for_the_log_by_its_lane() -> None:
    """Behind a router that keeps the arrival order, decider k of n defers a long-context arrival
    n + k log delays, then offers it, even on the same snapshot; decider 0 decides the short
    ones at once; one decider defers nothing."""
    alone = scheduler()
    (now,) = alone.submit([replace(req("x"), slo_class="long_context")], cluster_view(2), 0.0)
    assert now.action == "admit" and alone.next_wake_s() is None
    s = scheduler()
    s.decide_in_lane(0, 2, 0.005)
    view = cluster_view(2)
    long_prompt, short = replace(req("a"), slo_class="long_context"), req("b")
    held, placed = s.submit([long_prompt, short], view, 1.0)
    assert (held.action, held.pool, held.request.request_id) == ("queue", DEFERRED_POOL, "a")
    assert (placed.action, placed.request.request_id) == ("admit", "b")
    assert s.next_wake_s() == 1.0 + 2 * 0.005
    newer = cluster_view(2)
    assert s.tick(newer, 1.009) == []  # a new snapshot: not yet due
    (routed,) = s.tick(newer, 1.010)  # the same snapshot: offered, now due
    assert (routed.action, routed.request.request_id) == ("admit", "a")
    assert s.held_total == 0 and s.next_wake_s() is None


def test_with_several_deciders_decider_k_offers_its_held_requests_k_log_delays_after_a_new_snapshot() -> None:
    """So the pool's deciders take the room a snapshot shows one after another, each having
    read the earlier ones' placements; decider 0 offers at once, as one decider does."""
    delay = 0.005
    for k in (0, 1, 2):
        s = scheduler()
        (held,) = s.submit([req("a")], empty_view(), 0.0)  # no capacity: held
        s.decide_in_lane(k, 3, delay)
        assert held.pool == NO_CAPACITY_POOL and s.next_wake_s() is None
        room = cluster_view(2)
        offered = s.tick(room, 1.0)
        if k:
            assert offered == [] and s.next_wake_s() == 1.0 + k * delay
            assert s.tick(cluster_view(2), 1.0 + k * delay / 2) == []  # a newer snapshot: still waits
            offered = s.tick(room, 1.0 + k * delay)
        assert [(o.action, o.request.request_id) for o in offered] == [("admit", "a")]
        assert s.held_total == 0 and s.next_wake_s() is None


class Reversing(RoundRobin):
    """Round-robin that decides a batch of arrivals last first (``OrdersBatch``) while
    ``reordering``."""

    reordering = True

    def order(
        self, requests: Sequence[RequestView], candidates: Sequence[object], view: ClusterView
    ) -> list[int]:
        return list(reversed(range(len(requests)))) if self.reordering else list(range(len(requests)))

    def reorders(self, view: ClusterView) -> bool:
        return self.reordering


def test_with_several_deciders_a_burst_is_placed_long_prompts_first_one_decider_after_another() -> None:
    """While the router decides bursts in its own order (largest first), decider k of n waits k
    log delays before its long-context arrivals and n + k before its short ones; otherwise k
    before the short ones and n + k before the long ones. Deferred arrivals are placed in the
    router's order when due, as arrivals are."""
    delay = 0.005
    cases = ((True, 0, 0, 2), (True, 1, 1, 3), (False, 0, 2, 0), (False, 1, 3, 1))
    for (reordering, k, long_waits, short_waits), admission in itertools.product(cases, (PassThrough, Gate)):
        router = Reversing()
        router.reordering = reordering
        s = Scheduler("test", admission(), HomeDc(), router)  # type: ignore[arg-type]
        s.decide_in_lane(k, 2, delay)
        burst = [replace(req("long"), slo_class="long_context"), req("short-1"), req("short-2")]
        view = cluster_view(3)
        placed_at: dict[str, int] = {}
        order: list[str] = []
        outcomes = s.submit(burst, view, 1.0)
        for waits in range(4):
            if waits:
                outcomes = s.tick(view, 1.0 + waits * delay)
            for o in outcomes:
                if o.action == "admit":
                    placed_at[o.request.request_id] = waits
                    order.append(o.request.request_id)
        assert placed_at == {"long": long_waits, "short-1": short_waits, "short-2": short_waits}
        assert s.held_total == 0 and s.next_wake_s() is None
        shorts = [rid for rid in order if rid != "long"]
        routers_order = reordering and admission is PassThrough  # else admission's
        assert shorts == (["short-2", "short-1"] if routers_order else ["short-1", "short-2"])


def test_arrivals_are_placed_in_the_routers_order_held_requests_in_the_admissions() -> None:
    s = Scheduler("test", PassThrough(), HomeDc(), Reversing())
    placed = s.submit([req("a"), req("b"), req("c")], cluster_view(3), 0.0)
    assert [(o.request.request_id, o.instance_id) for o in placed] == [("c", "i0"), ("b", "i1"), ("a", "i2")]
    s.submit([req("d"), req("e")], empty_view(), 1.0)  # held: no capacity
    assert [o.request.request_id for o in s.tick(cluster_view(3), 2.0)] == ["d", "e"]
    # Behind an admission stage (it judged each request behind the ones before it): as offered.
    gated = Scheduler("test", Gate(), HomeDc(), Reversing())
    assert [o.request.request_id for o in gated.submit([req("a"), req("b")], cluster_view(3), 0.0)] == [
        "a",
        "b",
    ]


def test_behind_an_admission_stage_an_instants_long_prompts_go_first_while_the_router_reorders() -> None:
    """Admission's order within each class; the long-context arrivals before the short ones
    while the router would decide the burst largest first, so the short ones go around them."""
    for reordering, expected in (
        (True, ["long-1", "long-2", "a", "b"]),
        (False, ["a", "long-1", "b", "long-2"]),
    ):
        router = Reversing()
        router.reordering = reordering
        gated = Scheduler("test", Gate(), HomeDc(), router)
        burst = [req("a"), replace(req("long-1"), slo_class="long_context"), req("b")]
        burst.append(replace(req("long-2"), slo_class="long_context"))
        placed = gated.submit(burst, cluster_view(4), 0.0)
        assert [o.request.request_id for o in placed] == expected


def test_withdraw_drops_a_held_request() -> None:
    s = scheduler()
    s.submit([req("a")], empty_view(), 0.0)
    assert s.withdraw("a", 1) and not s.withdraw("a", 1)
    assert s.tick(cluster_view(1), 1.0) == []


class Gate:
    """Admission that queues requests named q-*, rejects r-* and admits the rest."""

    name = "gate"
    wants_kv_events = False

    def __init__(self) -> None:
        self.seen: list[Observation] = []

    def admit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Admission]:
        out = []
        for r in requests:
            if r.request_id.startswith("q-"):
                out.append(Admission("queue", "wait your turn", pool="slow"))
            elif r.request_id.startswith("r-"):
                out.append(Admission("reject", "cannot_meet_slo", predicted_ttft_s=9.0))
            else:
                out.append(Admission("admit", "ok"))
        return out

    def observe(self, event: Observation) -> None:
        self.seen.append(event)


def test_admission_answers_reach_the_caller_with_reason_pool_and_prediction() -> None:
    s = scheduler(Gate())
    queued, rejected, admitted = s.submit([req("q-1"), req("r-1"), req("a-1")], cluster_view(2), 0.0)
    assert (queued.action, queued.pool, queued.reason) == ("queue", "slow", "wait your turn")
    assert (rejected.action, rejected.reason, rejected.predicted_ttft_s) == ("reject", "cannot_meet_slo", 9.0)
    assert (admitted.action, admitted.admission_reason, admitted.dc) == ("admit", "ok", "dc")
    assert s.held() == {"slow": 1}


def test_home_dc_first_then_any_allowed_region() -> None:
    view = cluster_view(4)
    dcs = view.dc.copy()
    dcs[:] = ["us", "us", "eu", "eu"]
    object.__setattr__(view, "dc", dcs)
    s = Scheduler("t", PassThrough(), HomeDc(), LeastTokens())
    (home,) = s.submit([req("a", home_dc="eu")], view, 0.0)
    assert home.dc == "eu" and home.instance_id in {"i2", "i3"}
    (allowed,) = s.submit([req("b", allowed_regions=("us",), home_dc="eu")], view, 0.0)
    assert allowed.dc == "us" and allowed.instance_id in {"i0", "i1"}
    (nowhere,) = s.submit([req("c", allowed_regions=("ap",))], view, 0.0)
    assert nowhere.action == "queue" and nowhere.pool == NO_CAPACITY_POOL
