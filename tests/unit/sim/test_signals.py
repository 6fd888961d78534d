"""What reaches the router and when: delayed snapshots and KV events, spread arrivals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from agents.policy import Scheduler
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.types import BlocksChanged, BoolArray, ClusterView, Observation, Placement, RequestView
from sim.loop.config import SimConfig
from sim.loop.runner import Simulation
from sim.workloads.trace import Workload
from tests.unit.sim.helpers import fleet_of, request, workload


class Watching:
    """Places on the first candidate; records when each snapshot and KV event arrived."""

    name = "watching"
    wants_kv_events = True

    def __init__(self) -> None:
        self.views: list[tuple[float, float]] = []  # (decided at, snapshot taken at)
        self.kv: list[tuple[float, float]] = []  # (observed at, emitted at)
        self.now = 0.0

    def place(
        self,
        requests: Sequence[RequestView],
        candidates: Sequence[BoolArray],
        view: ClusterView,
        now_s: float,
    ) -> list[Placement]:
        self.views.append((now_s, float(view.last_heartbeat_s.max())))
        return [Placement(int(np.flatnonzero(mask)[0]), "first") for mask in candidates]

    def observe(self, event: Observation) -> None:
        if isinstance(event, BlocksChanged):
            self.kv.append((self.now, event.time_s))


class Clocked(Scheduler):
    """A scheduler that tells its stage the time of each observation (for the test only)."""

    def __init__(self, stage: Watching) -> None:
        super().__init__("watching", PassThrough(), HomeDc(), stage)
        self.stage = stage

    def tick(self, view: ClusterView, now_s: float) -> list:  # type: ignore[type-arg]
        self.stage.now = now_s
        return super().tick(view, now_s)


def _run(delay: float) -> Watching:
    stage = Watching()
    reqs = [request(f"r{i}", 0.05 + 0.3 * i, 1100, 20, blocks=[i % 3, 7]) for i in range(20)]
    config = SimConfig(seed=1, heartbeat_s=0.25, signal_delay_s=delay)
    sim = Simulation(workload(*reqs), fleet_of(2), Clocked(stage), config)
    original = sim._deliver

    def deliver(signal: object, now: float) -> None:
        stage.now = now
        original(signal, now)  # type: ignore[arg-type]

    sim._deliver = deliver  # type: ignore[method-assign]
    sim.run()
    return stage


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1])
def test_snapshots_and_kv_events_reach_the_router_after_the_signal_delay(delay: float) -> None:
    stage = _run(delay)
    assert stage.views and stage.kv
    # A decision at t sees the snapshot taken at the last heartbeat at or before t - delay (the
    # first round is taken at the first arrival, 0.05; before it arrives the start-up view rules).
    checked = [(d, t) for d, t in stage.views if d >= 0.05 + delay]
    assert checked
    for decided_at, taken_at in checked:
        assert taken_at <= decided_at - delay + 1e-9
        assert decided_at - taken_at <= 0.25 + delay + 1e-9
    for observed_at, emitted_at in stage.kv:
        assert observed_at == pytest.approx(emitted_at + delay)


def test_jitter_spreads_arrivals_inside_their_bin_seeded() -> None:
    reqs = [request(f"r{i}", 3.0 * (i // 10), 600, 10) for i in range(100)]  # ten per 3-s instant
    trace = workload(*reqs)
    spread = trace.jittered(3.0, seed=5)
    assert spread.jittered(0.0, seed=5) is spread
    assert spread.requests == trace.jittered(3.0, seed=5).requests  # seeded
    assert spread.requests != trace.jittered(3.0, seed=6).requests
    moved = {r.request_id: r.arrival_s for r in spread.requests}
    for r in reqs:
        assert r.arrival_s <= moved[r.request_id] < r.arrival_s + 3.0
    arrivals = [r.arrival_s for r in spread.requests]
    assert arrivals == sorted(arrivals)
    assert len(set(arrivals)) == len(arrivals)  # no two requests share an instant any more
    assert spread.name == "test+jitter3s"
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            trace.jittered(bad, seed=0)


def test_unjittered_workload_is_unchanged() -> None:
    trace: Workload = workload(request("a", 0.0, 600, 10))
    assert trace.jittered(0, seed=0) is trace
