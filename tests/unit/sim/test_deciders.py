"""Several deciders per pool in the simulator: the split, the decision log, and one decider."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from agents.policy import Scheduler, build_scheduler
from agents.policy.baselines import LeastTokens
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.types import Finished, FirstToken, Observation, Placed, RequestView
from sim.evaluation.capacity import capacities, format_capacity
from sim.loop.config import SimConfig
from sim.loop.deciders import Deciders, affinity_key, pool_decider_for
from sim.loop.runner import Simulation, simulate
from sim.workloads.sources import open_workload
from tests.unit.policy.helpers import cluster_view
from tests.unit.sim.helpers import fleet_of


def view_of(rid: str, blocks: tuple[int, ...] = (), tenant: str = "t", attempt: int = 1) -> RequestView:
    return RequestView(rid, attempt, tenant, "m", "interactive", 600 * max(len(blocks), 1), 16, blocks, 0.0)


class Recording(LeastTokens):
    """A router that keeps every observation it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Observation] = []

    def observe(self, event: Observation) -> None:
        super().observe(event)
        self.seen.append(event)


def deciders(n: int, delay_s: float = 0.005, split: str = "affinity") -> tuple[Deciders, list[Recording]]:
    routers = [Recording() for _ in range(n)]
    schedulers = [Scheduler("least-tokens", PassThrough(), HomeDc(), r) for r in routers]
    return Deciders(schedulers, delay_s, split, seed=0), routers  # type: ignore[arg-type]


def placed(router: Recording) -> list[tuple[str, float]]:
    return [(e.request.request_id, e.time_s) for e in router.seen if isinstance(e, Placed)]


def test_the_affinity_key_names_the_first_four_blocks_else_the_tenant() -> None:
    assert affinity_key(view_of("a", (11, 12, 13, 14, 15, 16))) == 14  # chained: it names blocks 1-4
    assert affinity_key(view_of("b", (11, 12))) == 12
    assert affinity_key(view_of("c", tenant="acme")) == zlib.crc32(b"acme")


def test_requests_sharing_a_prefix_meet_the_same_decider_and_random_is_seeded() -> None:
    pool, _ = deciders(4)
    shared = (1, 2, 3, 4)
    assert len({pool.decider_of(view_of(f"r{k}", (*shared, 100 + k)), 0.0) for k in range(20)}) == 1
    assert len({pool.decider_of(view_of(f"r{k}", (k, k + 1)), 0.0) for k in range(40)}) == 4
    series = [deciders(4, split="random")[0] for _ in range(2)]
    draws = [[pool.decider_of(view_of(f"r{k}"), 0.0) for k in range(40)] for pool in series]
    assert draws[0] == draws[1] and len(set(draws[0])) == 4


def test_a_prefix_hotter_than_one_publisher_should_send_to_one_decider_is_spread() -> None:
    """1 000 requests of one prefix in one second (above ``HOT_PREFIX_RATE_PER_S``): the first
    ones meet one decider, then the key is hot and its requests spread over all four; once it
    cools down (a quiet minute) it meets one decider again."""
    pool, _ = deciders(4)
    shared = (1, 2, 3, 4)
    chosen = [pool.decider_of(view_of(f"r{k}", (*shared, 100 + k)), k / 1000) for k in range(1000)]
    assert len(set(chosen[:400])) == 1
    assert set(chosen[600:]) == {0, 1, 2, 3}
    later = [pool.decider_of(view_of(f"s{k}", (*shared, 100 + k)), 60.0 + k) for k in range(10)]
    assert len(set(later)) == 1 and later[0] == chosen[0]


def in_lane(k: int, pool: Deciders, stem: str) -> RequestView:
    """A short request that decider ``k`` of ``pool`` decides."""
    return next(r for n in range(100) if pool.decider_of(r := view_of(f"{stem}{n}", (n, n + 1)), 0.0) == k)


def test_a_decider_reads_the_others_placements_after_the_log_delay() -> None:
    """Decider 0 decides its short arrival at once, decider 1 one log delay later, once the log
    shows decider 0's placement; decider 0 reads decider 1's a log delay after that."""
    pool, routers = deciders(2)
    v = cluster_view(2)
    a, b = in_lane(0, pool, "a"), in_lane(1, pool, "b")
    outcomes = pool.submit([a, b], v, 1.0)
    assert [(o.request.request_id, o.action) for o in outcomes] == [
        (a.request_id, "admit"),
        (b.request_id, "queue"),
    ]
    pool.tick(v, 1.004)
    assert placed(routers[0]) == placed(routers[1]) == []
    (decided,) = pool.tick(v, 1.005)
    assert decided.request.request_id == b.request_id and decided.action == "admit"
    assert placed(routers[1]) == [(a.request_id, 1.0)] and placed(routers[0]) == []
    pool.tick(v, 1.0099)
    assert placed(routers[0]) == []
    pool.tick(v, 1.010)
    assert placed(routers[0]) == [(b.request_id, 1.005)]


def test_a_placement_is_read_before_its_request_ends_and_never_by_its_decider() -> None:
    pool, routers = deciders(2)
    a = in_lane(0, pool, "a")
    (outcome,) = pool.submit([a], cluster_view(2), 1.0)
    end = Finished(a.request_id, 1, outcome.instance_id, "error", 1200, 0, 0, None, None, 1.0)
    pool.observe(end)  # an engine refused it at once
    mine, other = routers[0], routers[1]
    assert [type(e) for e in other.seen] == [Placed, Finished]
    assert [type(e) for e in mine.seen] == [Finished]
    assert other.in_flight.requests == {outcome.instance_id: 0}
    pool.tick(cluster_view(2), 2.0)  # read once only
    assert [type(e) for e in other.seen] == [Placed, Finished]


def test_a_long_prompt_is_decided_once_the_log_shows_the_others_placements_of_its_instant() -> None:
    """Behind a router that keeps the arrival order, a burst's short prompts are placed first,
    decider after decider (k log delays), and the long ones after every one of them (n + k)."""
    v = cluster_view(2)
    for lane in (0, 1):
        pool, routers = deciders(2)
        short = in_lane(lane, pool, "s")
        long_prompt = replace(in_lane(1 - lane, pool, "l"), slo_class="long_context")
        placed_on = {
            o.request.request_id: (0, o.instance_id)
            for o in pool.submit([short, long_prompt], v, 1.0)
            if o.action == "admit"
        }
        for delays in range(1, 4):
            for o in pool.tick(v, 1.0 + delays * 0.005):
                placed_on[o.request.request_id] = (delays, o.instance_id)
        assert {rid: delays for rid, (delays, _) in placed_on.items()} == {
            short.request_id: lane,
            long_prompt.request_id: 3 - lane,
        }
        assert (short.request_id, 1.0 + lane * 0.005) in placed(routers[1 - lane])  # seen first
        assert placed_on[short.request_id][1] != placed_on[long_prompt.request_id][1]
        assert pool.next_wake_s() is None


def test_a_new_hold_reaches_the_other_slomax_deciders_after_the_log_delay() -> None:
    schedulers = [build_scheduler("slomax+tokenpilot", seed=k) for k in range(2)]
    pool = Deciders(schedulers, 0.005, "affinity", seed=0)
    a = view_of("a", (0, 1))
    holder = pool.decider_of(a, 0.0)
    (held,) = pool.submit([a], cluster_view(0), 1.0)  # no instance serves it yet: held
    assert held.action == "queue"
    other = schedulers[1 - holder].admission
    pool.tick(cluster_view(0), 1.004)
    assert not other.waiting.elsewhere  # type: ignore[attr-defined]
    pool.tick(cluster_view(0), 1.005)
    assert set(other.waiting.elsewhere) == {("a", 1)}  # type: ignore[attr-defined]
    assert not schedulers[holder].admission.waiting.elsewhere  # type: ignore[attr-defined]
    assert not deciders(2)[0]._holds_shared  # a policy without SLOMax logs no hold


def test_every_decider_sees_first_tokens_and_ends_and_the_holder_withdraws() -> None:
    pool, routers = deciders(3)
    pool.observe(FirstToken("x", 1, "i0", 0.2, 0.2))
    assert all(len(r.seen) == 1 for r in routers)
    assert not pool.withdraw("x", 1)


def test_one_decider_is_the_scheduler_itself_and_documents_do_not_change() -> None:
    fleet = fleet_of(2)
    assert isinstance(pool_decider_for("tokenpilot", fleet, SimConfig()), Scheduler)
    assert SimConfig().deciders_fields() == {}
    work = open_workload("synthetic:duration_s=20,rate_per_s=4")
    alone = simulate(work, fleet, "slomax+tokenpilot", SimConfig())
    scheduler = build_scheduler("slomax+tokenpilot", seed=0)
    wrapped = Simulation(work, fleet, Deciders([scheduler]), SimConfig()).run()

    def times(run: object) -> list[tuple[object, ...]]:
        return [(a.request.request_id, a.status, a.first_token_s, a.end_s) for a in run.attempts]  # type: ignore[attr-defined]

    assert times(wrapped) == times(alone)


def test_several_deciders_are_named_in_the_capacity_document() -> None:
    work = open_workload("synthetic:duration_s=20,rate_per_s=4")
    config = SimConfig(deciders=2, decider_split="random", decision_log_delay_s=0.01)
    document = capacities(work, fleet_of(2), ["tokenpilot"], config, start=1.0, precision=0.5)
    assert (document["deciders"], document["decider_split"], document["decision_log_delay_s"]) == (
        2,
        "random",
        0.01,
    )
    assert "2 deciders per pool (random split, log 10 ms late)" in format_capacity(document)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"deciders": 0},
        {"decision_log_delay_s": -0.001},
        {"decision_log_delay_s": float("inf")},
        {"decider_split": "x"},
    ],
)
def test_bad_decider_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SimConfig(**kwargs)  # type: ignore[arg-type]
