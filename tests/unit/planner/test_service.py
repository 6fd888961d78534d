"""What the planner publishes (``planner/service.py:plans_to_publish``) and how its process is
set up (``planner/main.py``, ``tokenfleet planner``): changed plans and keep-alives only, warm
sets carried, prefill counts published, the interval chosen, the planner built by name, a bad
input as one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.policy.planners import StaticPlanner
from agents.policy.planners.contract import FleetState, Plan, PoolState
from cli.main import main
from infra.settings import Settings
from planner.fleet_state import FleetFacts
from planner.main import DEFAULT_INTERVAL_S, load_facts, make_fold, make_planner, plan_interval
from planner.service import plans_to_publish
from schemas.events import Heartbeat, ReplicaPlan

STATE = FleetState(
    now_s=100.0, models=(), dcs=(), demand=(),
    pools=(PoolState("m", "1", "A", ready=2), PoolState("n", "1", "B", ready=1, loading=2)),
)  # fmt: skip


def published(replicas: int, ts: float, model: str = "m", dc: str = "A", **fields: Any) -> ReplicaPlan:
    return ReplicaPlan(planner="p", model=model, model_version="1", dc=dc, replicas=replicas, ts=ts, **fields)


def publish(
    plan: Plan, newest: dict[tuple[str, str, str], ReplicaPlan], now_s: float = 100.0
) -> list[ReplicaPlan]:
    return plans_to_publish(plan, STATE, newest, now_s=now_s, keepalive_s=60.0, planner="fm", worker="h:1")


def test_a_pool_is_published_when_it_changes_or_its_plan_is_keepalive_old() -> None:
    plan = Plan(replicas={("m", "1", "A"): 3, ("n", "1", "B"): 1}, reasons={("m", "1", "A"): "demand up"})
    assert [(p.model, p.replicas, p.reason) for p in publish(plan, {})] == [
        ("m", 3, "demand up"),
        ("n", 1, ""),
    ]
    newest = {("m", "1", "A"): published(3, 90.0), ("n", "1", "B"): published(2, 90.0, "n", "B")}
    (sent,) = publish(plan, newest)
    assert (sent.model, sent.replicas, sent.planner, sent.worker) == ("n", 1, "fm", "h:1")
    assert [p.model for p in publish(plan, newest, now_s=150.0)] == ["m", "n"]  # m: 60 s old
    assert publish(Plan(), newest) == []  # a pool the plan does not name keeps its size


def test_a_warm_set_rides_on_the_dcs_plans_and_a_missing_one_is_carried() -> None:
    newest = {("m", "1", "A"): published(3, 90.0, warm=("m",))}
    same = Plan(replicas={("m", "1", "A"): 3})  # warm None: unchanged
    assert publish(same, newest) == []
    (kept,) = publish(same, newest, now_s=200.0)
    assert kept.warm == ("m",)  # the keep-alive carries the staged set it does not change
    (changed,) = publish(Plan(replicas={("m", "1", "A"): 3}, warm={"A": ("m", "n")}), newest)
    assert (changed.replicas, changed.warm) == (3, ("m", "n"))


def test_a_warm_set_for_a_dc_whose_pools_the_plan_does_not_name_keeps_their_size() -> None:
    (carrier,) = publish(Plan(warm={"B": ("n",)}), {})
    assert (carrier.model, carrier.dc, carrier.replicas, carrier.warm) == (
        "n",
        "B",
        3,
        ("n",),
    )  # ready + loading
    (carrier,) = publish(Plan(warm={"A": ()}), {("m", "1", "A"): published(5, 99.0)})
    assert (carrier.replicas, carrier.warm) == (5, ())  # the newest plan's replicas, not the fleet's 2
    assert publish(Plan(warm={"Z": ("m",)}), {}) == []  # no pool there to carry it


def test_a_pools_prefill_replicas_are_published_and_a_change_of_them_is_published_again() -> None:
    key = ("m", "1", "A")
    (sent,) = publish(Plan(replicas={key: 3}, prefill={key: 1}), {})
    assert (sent.replicas, sent.prefill_replicas) == (3, 1)
    assert publish(Plan(replicas={key: 3}, prefill={key: 1}), {key: sent}) == []  # unchanged
    (again,) = publish(Plan(replicas={key: 3}, prefill={key: 2}), {key: sent})
    assert (again.replicas, again.prefill_replicas) == (3, 2)  # same size, other split
    (unnamed,) = publish(Plan(replicas={key: 3}), {key: again})
    assert unnamed.prefill_replicas is None  # the pool keeps the prefill replicas it runs
    carried = publish(Plan(warm={"A": ("m",)}), {key: again})
    assert [(c.replicas, c.prefill_replicas, c.warm) for c in carried] == [(3, 2, ("m",))]


def test_the_fold_of_the_process_has_the_settings_kv_links() -> None:
    fold = make_fold(Settings(kv_link_gbps={"A": 25.0}), FleetFacts())
    for dc in ("A", "B"):  # the DCs the heartbeats show
        fold.add(Heartbeat(ts=1.0, instance_id=dc, dc=dc, model="m", model_version="1", waiting=0,
                           running=0, tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=1))  # fmt: skip
    assert {dc.name: dc.kv_link_gbps for dc in fold.snapshot(1.0).dcs} == {"A": 25.0, "B": 0.0}


def test_reasons_are_cut_to_the_wire_limit() -> None:
    (sent,) = publish(Plan(replicas={("m", "1", "A"): 1}, reasons={("m", "1", "A"): "x" * 5000}), {})
    assert len(sent.reason) == 1024


def test_the_interval_is_the_option_then_the_setting_then_the_planners_own() -> None:
    static = StaticPlanner()
    assert plan_interval(Settings(), static) == DEFAULT_INTERVAL_S  # static never replans on its own
    assert plan_interval(Settings(planner_interval_s=7.0), static) == 7.0
    assert plan_interval(Settings(planner_interval_s=7.0), static, 2.5) == 2.5

    class Every15:
        name, interval_s = "every15", 15.0

        def plan(self, state: FleetState) -> Plan:
            return Plan()

    assert plan_interval(Settings(), Every15()) == 15.0


@pytest.mark.parametrize("name", ["static", "hpa", "dynamo-sla", "fleetmind"])
def test_every_planner_is_built_by_name_for_the_fleet(name: str, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    group = "{count: 1, profile: llama3-8b-h100, model: m, version: '2'}"
    fleet.write_text(f"data_centres:\n  - {{name: A, instances: [{group}]}}\n")
    facts = load_facts(fleet)
    assert facts.engines == {("m", "2"): "llama3-8b-h100"}
    assert make_planner(name, facts, Settings()).name == name


def test_an_unknown_planner_or_one_that_lacks_its_inputs_is_one_line() -> None:
    with pytest.raises(ValueError, match="unknown planner 'nope'; known: static, hpa"):
        make_planner("nope", load_facts(None), Settings())
    with pytest.raises(ValueError, match="dynamo-sla needs each model's engine profile"):
        make_planner("dynamo-sla", load_facts(None), Settings())


def test_the_fleet_file_is_read_or_named_in_one_line(tmp_path: Path) -> None:
    assert load_facts(None).listed_gpus == {}
    good = tmp_path / "fleet.yaml"
    good.write_text(
        "data_centres:\n  - {name: A, gpus: 8, instances: [{count: 2, profile: llama3-70b-tp4-h100}]}\n"
    )
    assert load_facts(good).listed_gpus == {"A": 8}
    bad = tmp_path / "bad.yaml"
    bad.write_text("data_centres:\n  - {name: A, instances: [{profile: no-such-gpu}]}\n")
    with pytest.raises(ValueError, match=r"fleet file '.*bad.yaml': unknown engine profile 'no-such-gpu'"):
        load_facts(bad)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--planner", "nope"], {}, "unknown planner 'nope'"),
        (["--planner", "static", "--fleet", "absent.yaml"], {}, "fleet file 'absent.yaml'"),
        (["--planner", "static", "--interval", "0"], {}, "--interval"),
        (["--planner", "static"], {}, "no Kafka broker configured"),
        (["--planner", "static"], {"TOKENFLEET_PLANNER_HISTORY_S": "-1"}, "TOKENFLEET_PLANNER_HISTORY_S"),
    ],
)
def test_a_bad_command_line_or_setting_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOKENFLEET_KAFKA_BOOTSTRAP", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["planner", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenfleet planner: error: ") and err.count("\n") == 1 and says in err, err
