"""The fleet's shape in the simulator: replicas start within budget, load cold or warm, drain
without losing a request, and cost only while they hold their GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.policy.planners.contract import FleetState, Plan, PoolKey
from sim.engine.fleet import fleet_from_doc
from sim.loop.config import SimConfig
from sim.loop.replicas import Replicas, slot_fleet
from sim.loop.runner import simulate
from tests.unit.sim.helpers import request, workload

pytestmark = pytest.mark.unit

DOC = {
    "data_centres": [
        {
            "name": "A",
            "gpus": 3,
            "warm_capacity": 1,
            "warm_models": ["llama3-8b"],
            "instances": [{"count": 1, "profile": "llama3-8b-h100", "model": "llama3-8b"}],
        }
    ],
    "models": {
        "llama3-8b": {"load_s": {"cold": 100, "warm": 20}},
        "qwen3-14b": {"load_s": {"cold": 50, "warm": 10}, "profile": "qwen3-14b-h100"},
    },
}


def fleet():  # type: ignore[no-untyped-def]
    return fleet_from_doc(DOC, Path("shape.yaml"))


def replicas() -> Replicas:
    slots = slot_fleet(fleet())
    return Replicas(slots, 1, (0.0, 1000.0), grace_s=1.0)


LLAMA: PoolKey = ("llama3-8b", "1", "A")
QWEN: PoolKey = ("qwen3-14b", "1", "A")


def test_slots_fill_the_budget_per_model_and_the_listed_instance_is_ready() -> None:
    rows = replicas()
    ids = [slot.spec.instance_id for slot in rows.slots]
    assert ids[0] == "A/i000" and len([i for i in ids if "llama3-8b" in i]) == 2  # 3 GPUs: 1 + 2
    assert len([i for i in ids if "qwen3-14b" in i]) == 3
    assert rows.ready_mask().tolist() == [True] + [False] * 5


def test_a_start_holds_gpus_at_once_loads_warm_where_staged_and_never_exceeds_the_budget() -> None:
    rows = replicas()
    rows.apply(Plan({LLAMA: 2, QWEN: 5}), 0.0)
    starts, drains = rows.converge(0.0, [0] * 6)
    assert drains == []
    # llama is staged: warm (20 s); qwen cold (50 s); the budget (3 GPUs) holds one qwen only
    assert [(rows.slots[i].spec.model, ready) for i, ready in starts] == [
        ("llama3-8b", 20.0),
        ("qwen3-14b", 50.0),
    ]
    assert rows.fleet_state(0.0, _view(rows), range(len(rows.slots)), (), (2.0, 0.1)).dcs[0].gpus_used == 3
    for index, ready in starts:
        rows.became_ready(index, ready)
    figures = rows.figures(100.0, {})
    assert figures["replica_starts"] == 2 and figures["warm_starts"] == 1 and figures["cold_starts"] == 1
    assert figures["time_to_ready_s"] == {"p50": 35.0, "p95": 48.5}  # 20 s and 50 s
    # GPU-hours: the listed instance 100 s, the two started ones 100 s each, all 1-GPU profiles
    assert figures["gpu_hours"] == pytest.approx(300 / 3600, abs=1e-6)


def test_a_dc_without_gpus_holds_the_gpus_of_the_instances_it_lists_not_of_the_slots() -> None:
    doc = {**DOC, "data_centres": [{k: v for k, v in DOC["data_centres"][0].items() if k != "gpus"}]}
    rows = Replicas(slot_fleet(fleet_from_doc(doc, Path("tight.yaml"))), 1, (0.0, 1000.0), grace_s=1.0)
    assert rows.fleet.gpu_budget("A") == 1  # one llama listed; the slots do not raise it
    rows.apply(Plan({LLAMA: 1, QWEN: 3}), 0.0)
    starts, _ = rows.converge(0.0, [0] * len(rows.slots))
    assert starts == []  # the listed instance holds the whole budget


def test_shrinking_cancels_loading_first_then_drains_the_least_loaded_which_stops_after_its_grace() -> None:
    rows = replicas()
    rows.apply(Plan({LLAMA: 2}), 0.0)
    ((started, _),) = rows.converge(0.0, [0] * 6)[0]
    rows.apply(Plan({LLAMA: 1}), 5.0)
    assert rows.converge(5.0, [0] * 6) == ([], [])  # the loading one is cancelled
    assert not rows.is_on(started)
    rows.apply(Plan({LLAMA: 0}), 6.0)
    _, drains = rows.converge(6.0, [0] * 6)
    assert drains == [0] and rows.is_draining(0) and not rows.ready_mask()[0]
    assert not rows.stop_if_done(0, idle=True, now=6.5)  # within the grace
    assert not rows.stop_if_done(0, idle=False, now=8.0)  # still running something
    assert rows.stop_if_done(0, idle=True, now=8.0) and not rows.is_on(0)
    assert rows.held_s(100.0)[0] == pytest.approx(8.0) and rows.held_s(100.0)[started] == pytest.approx(5.0)


def test_a_plan_s_prefill_replicas_start_as_prefill_and_drain_first_where_the_dc_has_a_link() -> None:
    linked = {**DOC, "data_centres": [{**DOC["data_centres"][0], "gpus": 4, "kv_link_gbps": 400}]}
    rows = Replicas(slot_fleet(fleet_from_doc(linked, Path("pd.yaml"))), 1, (0.0, 1000.0), grace_s=1.0)
    rows.apply(Plan({LLAMA: 3}, prefill={LLAMA: 2}), 0.0)
    starts, _ = rows.converge(0.0, [0] * len(rows.slots))
    roles = [rows.specs()[i].role for i, _ in starts]
    assert sorted(roles) == ["prefill", "prefill"]  # the listed instance is the one ``both``
    state = rows.fleet_state(0.0, _view(rows), range(len(rows.slots)), (), (2.0, 0.1))
    assert state.dcs[0].kv_link_gbps == 400 and state.models[0].kv_bytes_per_token == 128 * 1024
    for index, ready in starts:
        rows.became_ready(index, ready)
    rows.apply(Plan({LLAMA: 3}, prefill={LLAMA: 1}), 30.0)  # same size, one role changes
    starts_after, drains = rows.converge(30.0, [0] * len(rows.slots))
    assert [rows.specs()[i].role for i in drains] == ["prefill"]
    assert [rows.specs()[i].role for i, _ in starts_after] == ["both"]
    rows.apply(Plan({LLAMA: 3}), 40.0)  # not named: the prefill replica it runs stays
    assert rows.converge(40.0, [0] * len(rows.slots)) == ([], [])


def test_without_a_link_a_plan_s_prefill_replicas_start_as_both() -> None:
    rows = replicas()
    rows.apply(Plan({LLAMA: 2}, prefill={LLAMA: 1}), 0.0)
    starts, _ = rows.converge(0.0, [0] * 6)
    assert [rows.specs()[i].role for i, _ in starts] == ["both"]


def test_staging_evicts_a_model_the_plan_no_longer_lists_and_takes_the_cold_load_time() -> None:
    rows = replicas()
    rows.apply(Plan({}, {"A": ("qwen3-14b",)}), 10.0)
    dc = rows.fleet_state(30.0, _view(rows), range(len(rows.slots)), (), (2.0, 0.1)).dcs[0]
    assert dc.warm == () and dc.staging == ("qwen3-14b",)  # staged at 10 + 50 s
    assert rows.fleet_state(60.0, _view(rows), range(len(rows.slots)), (), (2.0, 0.1)).dcs[0].warm == (
        "qwen3-14b",
    )


@dataclass
class Stepper:
    """A planner that asks for ``plans[k]`` at its k-th call (then the last one)."""

    plans: list[dict[PoolKey, int]]
    name: str = "stepper"
    interval_s: float = 5.0
    calls: list[float] = field(default_factory=list)

    def plan(self, state: FleetState) -> Plan:
        self.calls.append(state.now_s)
        return Plan(self.plans[min(len(self.calls) - 1, len(self.plans) - 1)])


def test_a_run_that_scales_up_then_down_answers_every_request_and_counts_starts() -> None:
    requests = [request(f"r{k}", k * 0.5, 800, 60) for k in range(120)]
    planner = Stepper([{LLAMA: 1}, {LLAMA: 2}, {LLAMA: 2}, {LLAMA: 2}, {LLAMA: 2}, {LLAMA: 2}, {LLAMA: 1}])
    run = simulate(workload(*requests), fleet(), "least-tokens", SimConfig(), planner=planner)
    assert all(a.status == "ok" for a in run.attempts) and len(run.attempts) == 120
    assert run.shape["replica_starts"] == 1 and run.shape["warm_starts"] == 1
    assert run.shape["lost_in_scale_down"] == 0
    used = {a.instance.spec.instance_id for a in run.attempts if a.instance is not None}
    assert used == {"A/i000", "A/llama3-8b/r1"}  # the new replica served once ready
    started = run.instances.index(next(s for s in run.instances if s.instance_id == "A/llama3-8b/r1"))
    assert 0 < run.held_s[started] < run.held_s[0] == pytest.approx(59.5)
    assert planner.calls[0] == 0.0 and planner.calls[1] == 5.0


def _view(rows: Replicas):  # type: ignore[no-untyped-def]
    """A view with every row idle (what ``fleet_state`` reads of the heartbeats)."""
    import numpy as np

    from agents.policy.types import ClusterView

    n = len(rows.slots)
    zeros = np.zeros(n, dtype=np.int64)
    specs = [slot.spec for slot in rows.slots]
    return ClusterView(
        1,
        tuple(s.instance_id for s in specs),
        np.array([s.dc for s in specs]),
        np.array([s.model for s in specs]),
        np.array([s.version for s in specs]),
        np.array([s.profile.name for s in specs]),
        rows.ready_mask(),
        zeros,
        zeros,
        zeros,
        zeros,
        np.full(n, 100, dtype=np.int64),
        np.zeros(n),
    )
