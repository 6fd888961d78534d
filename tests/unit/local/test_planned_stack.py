"""``tokenfleet up --planner`` without starting a stack: the plan (server slots, the planner part,
the dispatcher's inventory, the planner's fleet file), the options it refuses, what ``status``
makes of a planned stack's servers, and a stack with a KV connector (``--kv-connector example``:
the servers' connector, the worker's and the planner's KV link, the roles in the dispatcher's
inventory)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from cli.main import main
from infra.settings import Settings
from infra.vllm.inventory import load_inventory
from local import refresh
from local.plan import KV_DIR, LOCAL_KV_LINK_GBPS, TINY_MODEL, Plan, UpOptions, make_plan
from local.scaling import ENGINES_FILE, FLEET_FILE, write_engines
from local.state import PartState, StackState, start_time, write_state
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import free_ports
from sim.engine.fleet import parse_fleet
from sim.engine.profiles import get_profile


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stack directory with the tiny model's tokenizer already built (the plans share it)."""
    directory = tmp_path_factory.mktemp("planned") / "up"
    ensure_tiny_model(directory / "model", TINY_MODEL)
    return directory


@pytest.fixture(autouse=True)
def settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stack setting of the caller's leaks in; the data dir is the test's."""
    for name in list(os.environ):
        if name.startswith("TOKENFLEET_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TOKENFLEET_WORKER_WEB_PORT", "0")
    monkeypatch.setenv("TOKENFLEET_DISPATCHER_WEB_PORT", "0")


def test_a_planned_stack_lists_every_slot_and_starts_the_first_ones(stack_dir: Path) -> None:
    options = UpOptions(
        dir=stack_dir, engines="emulated", servers=1, port=0, planner="hpa", max_servers=3,
        planner_interval_s=2.0, planner_params=("scale_down_window_s=20",), load_s=1.5, max_num_seqs=4,
    )  # fmt: skip
    plan = make_plan(options, Settings())
    assert Plan.from_json(plan.to_json()) == plan
    scaling = plan.scaling
    assert scaling is not None and scaling.servers == ["emulated-0", "emulated-1", "emulated-2"]
    assert (scaling.initial, scaling.model, scaling.dc, scaling.planner) == (1, "llama3-8b", "dc-1", "hpa")
    parts = {p.name: p for p in plan.parts}
    assert parts["dispatcher"].after == ["worker", "emulated-0"]  # the slots in standby are not waited for
    assert parts["dispatcher"].argv[-2:] == ["--inventory", str(stack_dir / ENGINES_FILE)]
    assert parts["planner"].argv[-9:] == [
        "planner", "--planner", "hpa", "--fleet", str(stack_dir / FLEET_FILE), "--interval", "2",
        "--param", "scale_down_window_s=20",
    ]  # fmt: skip
    assert parts["planner"].probe.endswith("/ready") and parts["planner"].env["TOKENFLEET_PLANNER_WEB_PORT"]
    assert parts["planner"].after == ["dispatcher"]
    assert parts["emulated-2"].argv[-4:] == ["--max-num-seqs", "4", "--load-s", "1.5"]
    # The gateway reaches every slot; the dispatcher drives the servers started.
    assert [i.instance_id for i in load_inventory(stack_dir / "inventory.yaml").instances] == scaling.servers
    assert [i.instance_id for i in load_inventory(scaling.engines_file).instances] == ["emulated-0"]
    fleet = parse_fleet(scaling.fleet_file)
    assert fleet.gpu_budget("dc-1") == 3 and len(fleet.instances) == 1
    load = fleet.shape.model("llama3-8b")
    assert (load.cold_s, load.warm_s, load.min_replicas) == (1.5, 1.5, 1)


def test_without_a_planner_the_plan_is_as_before(stack_dir: Path) -> None:
    plan = make_plan(UpOptions(dir=stack_dir, engines="emulated", servers=2, port=0), Settings())
    assert plan.scaling is None and [p.name for p in plan.parts if p.kind == "planner"] == []
    (dispatcher,) = [p for p in plan.parts if p.kind == "dispatcher"]
    assert dispatcher.argv[-1] == str(stack_dir / "inventory.yaml")
    assert dispatcher.after == ["worker", "emulated-0", "emulated-1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engines", "emulated", "--max-servers", "3"], "--max-servers needs --planner NAME"),
        (
            ["--engines", "emulated", "--planner-interval", "1"],
            "--planner-interval needs --planner NAME",
        ),
        (["--engines", "emulated", "--planner-param", "a=1"], "--planner-param needs --planner NAME"),
        (["--engines", "emulated", "--planner", "hpa", "--planner-param", "a"], "'a' is not NAME=VALUE"),
        (["--engines", "emulated", "--load-s", "0"], "0 is not a finite number in (0, 3600]"),
        (["--planner", "hpa"], "--planner: only with --engines local or emulated"),
        (["--engines", "emulated", "--planner", "nope"], "unknown planner 'nope'"),
        (["--engines", "local", "--load-s", "2"], "--load-s: only with --engines emulated"),
        (
            ["--engines", "emulated", "--planner", "hpa", "--servers", "3", "--max-servers", "2"],
            "--max-servers must be in [--servers (3), 16], not 2",
        ),
        (
            ["--engines", "emulated", "--planner", "hpa", "--fleet", "2xllama3-8b-h100"],
            "give --servers N, not --fleet",
        ),
        (["--kv-connector", "example"], "--kv-connector: only with --engines local or emulated"),
        (["--engines", "emulated", "--kv-connector", "nixl"], "must be one of example, not 'nixl'"),
        (["--kv-connector", "none"], "no engine inventory"),  # none: no connector, allowed anywhere
    ],
)
def test_options_a_planned_stack_cannot_work_with_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    assert main(["up", *args, "--port", "0", "--dir", str(tmp_path / "up")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_status_shows_the_servers_as_the_follower_left_them(tmp_path: Path) -> None:
    me, began = os.getpid(), start_time(os.getpid())  # "their process": this one
    silent = f"tcp://127.0.0.1:{free_ports(1)[0]}"  # a probe nothing answers
    parts = [
        PartState("emulated-0", "emulated", "", silent, "", pid=me, start_time=began, state="draining"),
        PartState("emulated-1", "emulated", "", silent, "", pid=me, start_time=began, state="loading"),
        PartState("emulated-2", "emulated", "", silent, "", state="standby"),
        PartState("emulated-3", "emulated", "", "", "", pid=me, start_time=began, state="loading"),
    ]
    state = StackState(
        dir=str(tmp_path), mode="emulated", phase="ready", supervisor_pid=me, supervisor_start=began,
        bootstrap="", gateway_url="", model="m", api_key_file="", clickhouse="", data_dir="", parts=parts,
    )  # fmt: skip
    write_state(tmp_path, state)
    found = refresh(tmp_path)
    assert found is not None
    assert found[1] == {
        "emulated-0": "draining",
        "emulated-1": "loading",
        "emulated-2": "standby",
        "emulated-3": "ready",  # loaded: its probe answers (none: a part that runs is ready)
    }


# -- a KV connector ------------------------------------------------------------------------------


def test_with_a_connector_the_worker_and_the_planner_get_a_link_and_the_emulated_inventory_a_kv_size(
    stack_dir: Path,
) -> None:
    options = UpOptions(
        dir=stack_dir, engines="emulated", servers=1, port=0, planner="fleetmind", max_servers=3,
        kv_connector="example",
    )  # fmt: skip
    plan = make_plan(options, Settings())
    assert Plan.from_json(plan.to_json()) == plan and plan.kv_connector == "example"
    parts = {p.name: p for p in plan.parts}
    for name in ("worker", "planner"):
        assert json.loads(parts[name].env["TOKENFLEET_KV_LINK_GBPS"]) == {"dc-1": LOCAL_KV_LINK_GBPS}
    assert "TOKENFLEET_KV_LINK_GBPS" not in parts["dispatcher"].env
    assert not any("kv-transfer" in flag for flag in parts["emulated-0"].argv)  # no connector there
    kv_size = get_profile("llama3-8b-h100").kv_bytes_per_token
    assert {i.kv_bytes_per_token for i in load_inventory(stack_dir / "inventory.yaml").instances} == {kv_size}
    without = make_plan(dataclasses.replace(options, kv_connector=None), Settings())
    (worker,) = [p for p in without.parts if p.kind == "worker"]
    assert without.kv_connector == "" and "TOKENFLEET_KV_LINK_GBPS" not in worker.env


def test_the_settings_link_wins_over_the_stacks_own(stack_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFLEET_KV_LINK_GBPS", '{"dc-1": 100, "elsewhere": 5}')
    options = UpOptions(dir=stack_dir, engines="emulated", servers=1, port=0, kv_connector="example")
    (worker,) = [p for p in make_plan(options, Settings()).parts if p.kind == "worker"]
    assert json.loads(worker.env["TOKENFLEET_KV_LINK_GBPS"]) == {"dc-1": 100.0}


def test_local_servers_get_the_example_connector_in_kv_both_on_one_shared_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENFLEET_VLLM_PYTHON", sys.executable)  # the plan only names it
    options = UpOptions(
        dir=tmp_path / "up", engines="local", servers=1, port=0, planner="fleetmind", max_servers=2,
        kv_connector="example",
    )  # fmt: skip
    plan = make_plan(options, Settings())
    servers = [p for p in plan.parts if p.kind == "vllm"]
    assert [p.name for p in servers] == ["vllm-0", "vllm-1"]
    shared = tmp_path / "up" / KV_DIR
    for server in servers:
        config = json.loads(server.argv[server.argv.index("--kv-transfer-config") + 1])
        assert config == {
            "kv_connector": "ExampleConnector",
            "kv_connector_extra_config": {"shared_storage_path": str(shared.resolve())},
            "kv_role": "kv_both",
        }
    assert shared.is_dir()
    (worker,) = [p for p in plan.parts if p.kind == "worker"]
    assert json.loads(worker.env["TOKENFLEET_KV_LINK_GBPS"]) == {"local": LOCAL_KV_LINK_GBPS}
    inventory = load_inventory(tmp_path / "up" / "inventory.yaml")
    assert {i.kv_bytes_per_token for i in inventory.instances} == {2048}  # the tiny model's, float32


def test_the_dispatchers_inventory_lists_each_server_in_its_role(stack_dir: Path) -> None:
    options = UpOptions(dir=stack_dir, engines="emulated", servers=1, port=0, planner="hpa", max_servers=3)
    scaling = make_plan(options, Settings()).scaling
    assert scaling is not None
    write_engines(scaling, {"emulated-0": "both", "emulated-2": "prefill"})
    listed = {i.instance_id: i.role for i in load_inventory(scaling.engines_file).instances}
    assert listed == {"emulated-0": "both", "emulated-2": "prefill"}
