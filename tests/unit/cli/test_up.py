"""``tokenfleet up``, ``status`` and ``down`` without starting a stack: bad input is one line and
exit 2, the plan of each engines mode, the state file, the local API key, the snippet."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

from cli.main import main
from gateway.auth import key_hash, load_keys
from infra.settings import Settings
from infra.vllm.inventory import load_inventory
from local.plan import PRODUCT_POLICY, Plan, UpOptions, local_key, make_plan
from local.report import snippet, table
from local.state import (
    LOCK_FILE,
    MARKER_ENV,
    PartState,
    StackState,
    alive,
    left_over,
    read_state,
    start_time,
    write_state,
)
from worker.ready import child_restarts, write_marker

INVENTORY = """\
models:
  llama3-8b: {version: v1}
instances:
  - {id: gpu-0, url: "http://10.0.0.5:8000", model: llama3-8b}
  - {id: gpu-1, url: "http://10.0.0.6:8000", model: llama3-8b}
"""


@pytest.fixture(autouse=True)
def settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stack setting of the caller's leaks in; the data dir is the test's."""
    for name in list(os.environ):
        if name.startswith("TOKENFLEET_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TOKENFLEET_WORKER_WEB_PORT", "0")
    monkeypatch.setenv("TOKENFLEET_DISPATCHER_WEB_PORT", "0")


def one_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up", "--engines", "gpu"], "'gpu' is not one of"),
        (
            ["up", "--engines", "local", "--fleet", "2xllama3-8b-h100"],
            "--fleet: only with --engines emulated",
        ),
        (["up", "--servers", "2"], "--servers: only with --engines local or emulated"),
        (["up", "--engines", "emulated", "--servers", "2", "--fleet", "2xllama3-8b-h100"], "not both"),
        (["up", "--engines", "local", "--inventory", "x.yaml"], "--inventory: only with --engines inventory"),
        (["up", "--engines", "local", "--servers", "0"], "0 is not an integer in [1, 16]"),
        (["up", "--port", "70000"], "70000 is not an integer in [0, 65535]"),
        (["up", "--timeout", "nan"], "nan is not a finite number"),
        (["up", "--inventory", "/no/such.yaml"], "--inventory /no/such.yaml: no such file"),
        (["up", "--engines", "emulated", "--policy", "nope"], "nope"),
        (["up", "--engines", "emulated", "--fleet", "2xnope"], "unknown engine profile 'nope'"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    err = one_error(capsys, [*args, "--dir", str(tmp_path / "up")])
    assert err.startswith("tokenfleet up: error: ") and message in err
    assert not (tmp_path / "up" / "state.json").exists()


def test_no_inventory_says_how_to_get_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = one_error(capsys, ["up", "--port", "0", "--dir", str(tmp_path / "up")])
    assert "no engine inventory: pass --inventory FILE or set TOKENFLEET_INVENTORY" in err
    assert "--engines local" in err


def test_local_engines_without_vllm_name_make_engine(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOKENFLEET_VLLM_PYTHON", str(tmp_path / "no-python"))
    err = one_error(capsys, ["up", "--engines", "local", "--port", "0", "--dir", str(tmp_path / "up")])
    assert "make engine" in err


def test_a_model_directory_needs_a_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOKENFLEET_VLLM_PYTHON", sys.executable)
    (tmp_path / "model").mkdir()
    args = ["up", "--engines", "local", "--model", str(tmp_path / "model"), "--port", "0"]
    args += ["--dir", str(tmp_path / "up")]
    assert "not a model directory (no config.json)" in one_error(capsys, args)


def test_a_busy_gateway_port_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import socket

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = ["up", "--inventory", str(inventory), "--port", port, "--dir", str(tmp_path / "up")]
        assert f"port {port} is in use" in one_error(capsys, args)


def test_an_unreachable_broker_is_one_line_within_seconds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import time

    from infra.kafka.broker import free_port

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")  # nobody listens
    started = time.monotonic()
    err = one_error(
        capsys, ["up", "--inventory", str(inventory), "--port", "0", "--dir", str(tmp_path / "up")]
    )
    assert time.monotonic() - started < 10
    assert err.startswith("tokenfleet up: error: no Kafka broker answers at 127.0.0.1:")
    assert "--wait-for-broker" in err
    assert not (tmp_path / "up").exists()  # nothing planned, nothing started


def test_wait_for_broker_starts_anyway_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import local
    from infra.kafka.broker import free_port

    started: list[UpOptions] = []

    def fake_up(options: UpOptions, settings: Settings, **kwargs: object) -> StackState:
        started.append(options)
        return state_of(tmp_path, phase="stopped")

    monkeypatch.setattr(local, "up", fake_up)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    args = ["up", "--inventory", str(inventory), "--port", "0", "--dir", str(tmp_path / "up")]
    assert main([*args, "--wait-for-broker"]) == 0
    assert len(started) == 1
    assert "no Kafka broker answers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "configured", "runs"),
    [
        (None, None, "slomax+tokenpilot"),  # the product, not the settings' baseline default
        (None, "tokenpilot", "tokenpilot"),  # TOKENFLEET_POLICY
        ("least-tokens", "tokenpilot", "least-tokens"),  # --policy
    ],
)
def test_the_stack_runs_the_product_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str | None, configured: str | None, runs: str
) -> None:
    from rich.console import Console

    if configured is not None:
        monkeypatch.setenv("TOKENFLEET_POLICY", configured)
    plan = make_plan(UpOptions(dir=tmp_path / "up", engines="emulated", policy=given, port=0), Settings())
    worker = next(p for p in plan.parts if p.kind == "worker")
    assert plan.policy == runs and worker.argv[-2:] == ["--policy", runs]
    out = Console(width=200, record=True)  # what up and status print
    out.print(table(state_of(tmp_path, policy=plan.policy), {}))
    assert f"policy {runs}" in out.export_text()


def test_the_help_names_the_policy_the_stack_runs() -> None:
    from cli.up import PRODUCT_POLICY as SHOWN

    assert SHOWN == PRODUCT_POLICY


def test_up_refuses_a_directory_whose_stack_is_up(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "up"
    directory.mkdir()
    with (directory / LOCK_FILE).open("ab") as lock:  # as a live supervisor holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        err = one_error(capsys, ["up", "--engines", "emulated", "--dir", str(directory)])
    assert f"a stack is already up in {directory}: run `tokenfleet down --dir {directory}` first" in err


def test_status_without_a_stack_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = one_error(capsys, ["status", "--dir", str(tmp_path / "none")])
    assert (
        err == f"tokenfleet status: error: no stack in {tmp_path / 'none'} (start one with `tokenfleet up`)\n"
    )


def test_down_without_a_stack_has_nothing_to_do(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["down", "--dir", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out == f"nothing runs in {tmp_path / 'none'}\n"


def test_the_default_directory_is_under_the_data_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["down"]) == 0
    assert capsys.readouterr().out == f"nothing runs in {tmp_path / 'data' / 'up'}\n"


# -- the plan -------------------------------------------------------------------------------------


def test_the_emulated_plan_serves_its_fleet_behind_the_gateway(tmp_path: Path) -> None:
    fleet = "2xllama3-8b-h100+1xqwen3-14b-h100"
    plan = make_plan(UpOptions(dir=tmp_path / "up", engines="emulated", fleet=fleet, port=0), Settings())
    names = [
        "broker",
        "emulated-0",
        "emulated-1",
        "emulated-2",
        "worker",
        "dispatcher",
        "gateway",
        "gateway-2",
    ]
    assert [p.name for p in plan.parts] == names
    broker, *servers, worker, dispatcher, gateway, second = plan.parts
    assert plan.bootstrap == broker.address and broker.probe == f"tcp://{broker.address}"
    assert "--storage-engine" in broker.argv and "memory://tansu/" in broker.argv
    assert worker.argv[-5:] == ["worker", "--loglevel", "info", "--policy", "slomax+tokenpilot"]
    assert worker.after == ["broker"] and plan.policy == PRODUCT_POLICY == "slomax+tokenpilot"
    assert worker.restarts_file == str((tmp_path / "data" / "tokenfleet.worker.ready").resolve())
    inventory_path = str(tmp_path / "up" / "inventory.yaml")
    inventory = load_inventory(inventory_path)
    assert dispatcher.argv[-4:] == ["--engine", "vllm", "--inventory", inventory_path]
    assert dispatcher.after == ["worker", "emulated-0", "emulated-1", "emulated-2"]
    assert gateway.argv[gateway.argv.index("--inventory") + 1] == dispatcher.argv[-1]
    # Two gateway processes share the calls' port; each one's probes are on a port of its own.
    port = gateway.argv[gateway.argv.index("--port") + 1]
    assert second.argv[second.argv.index("--port") + 1] == port and "--reuse-port" in second.argv
    assert gateway.address == second.address == plan.gateway_url and gateway.probe != second.probe
    assert gateway.probe.endswith(f":{gateway.argv[gateway.argv.index('--probe-port') + 1]}/ready")
    for server, entry in zip(servers, inventory.instances, strict=True):
        assert server.kind == "emulated" and server.argv[1:3] == ["-m", "local.emulated_vllm"]
        assert entry.instance_id == server.name and server.probe == entry.url + "/health"
        flag = {k: v for k, v in zip(server.argv[3::2], server.argv[4::2], strict=True)}
        assert flag["--port"] == entry.url.rsplit(":", 1)[1] and flag["--kv-events"] == entry.kv_events
        assert flag["--kv-replay"] == entry.kv_replay and flag["--served-model-name"] == entry.model
        assert Path(flag["--tokenizer"]) == inventory.models["llama3-8b"].tokenizer
    assert [flag for s in servers for flag in s.argv if "-h100" in flag] == [
        "llama3-8b-h100", "llama3-8b-h100", "qwen3-14b-h100",
    ]  # fmt: skip
    assert {i.model for i in inventory.instances} == {"llama3-8b"}  # a string spec is one pool
    assert (Path(flag["--tokenizer"]) / "tokenizer.json").is_file()
    for part in plan.parts:
        assert part.env[MARKER_ENV] == str((tmp_path / "up").resolve())
        assert part.env["TOKENFLEET_KAFKA_BOOTSTRAP"] == plan.bootstrap
    assert worker.env["TOKENFLEET_DATA_DIR"] == str((tmp_path / "data").resolve())
    assert plan.gateway_url.startswith("http://127.0.0.1:") and plan.model == "llama3-8b"
    assert Path(plan.api_key_file).is_file()
    assert plan.clickhouse == f"embedded: {(tmp_path / 'data' / 'clickhouse').resolve()}"
    assert Plan.from_json(plan.to_json()) == plan


def test_emulated_servers_default_to_two_of_the_8b_profile(tmp_path: Path) -> None:
    plan = make_plan(UpOptions(dir=tmp_path / "up", engines="emulated", port=0), Settings())
    assert [p.name for p in plan.parts if p.kind == "emulated"] == ["emulated-0", "emulated-1"]
    three = make_plan(UpOptions(dir=tmp_path / "three", engines="emulated", servers=3, port=0), Settings())
    profiles = [p.argv[p.argv.index("--profile") + 1] for p in three.parts if p.kind == "emulated"]
    assert profiles == ["llama3-8b-h100"] * 3


def test_an_inventory_plan_uses_the_configured_broker_and_makes_a_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", "kafka-1:9092")
    monkeypatch.setenv("TOKENFLEET_INVENTORY", str(inventory))
    monkeypatch.setenv("TOKENFLEET_CLICKHOUSE_DSN", "http://tf:secret@ch:8123/tokenfleet")
    options = UpOptions(dir=tmp_path / "up", policy="tokenpilot", port=0, host="0.0.0.0")
    plan = make_plan(options, Settings())
    assert [p.name for p in plan.parts] == ["worker", "dispatcher", "gateway", "gateway-2"]
    worker, dispatcher, gateway, _ = plan.parts
    assert plan.bootstrap == "kafka-1:9092" and worker.after == []
    assert worker.argv[-2:] == ["--policy", "tokenpilot"]
    assert json.loads(worker.env["TOKENFLEET_POOLS"]) == ["llama3-8b"]
    assert dispatcher.argv[-4:] == ["--engine", "vllm", "--inventory", str(inventory.resolve())]
    assert gateway.argv[gateway.argv.index("--host") + 1] == "0.0.0.0"
    assert plan.gateway_url.startswith("http://127.0.0.1:") and plan.gateway_url.endswith("/v1")
    assert gateway.env["TOKENFLEET_API_KEYS"] == str((tmp_path / "up" / "api-keys.yaml").resolve())
    assert plan.engines == [("gpu-0", "http://10.0.0.5:8000"), ("gpu-1", "http://10.0.0.6:8000")]
    assert plan.model == "llama3-8b" and plan.clickhouse == "http://tf:***@ch:8123/tokenfleet"
    key = Path(plan.api_key_file).read_text().strip()
    assert [e.sha256 for e in load_keys(tmp_path / "up" / "api-keys.yaml")] == [key_hash(key)]


def test_a_local_plan_serves_a_model_directory_with_its_weights(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    (model / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("TOKENFLEET_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    directory = tmp_path / ("long-" * 16) / "up"  # too long a path for vLLM's IPC sockets
    options = UpOptions(dir=directory, engines="local", model=model, servers=3, port=0)
    plan = make_plan(options, Settings())
    names = ["broker", "vllm-0", "vllm-1", "vllm-2", "worker", "dispatcher", "gateway", "gateway-2"]
    assert [p.name for p in plan.parts] == names
    server = plan.parts[1]
    assert server.argv[server.argv.index("--max-model-len") + 1] == "2048"
    assert server.argv[-2:] == ["--load-format", "auto"]  # after the launcher's dummy: it wins
    assert "PYTHONPATH" in server.drop_env and server.probe.endswith("/health")
    assert server.scratch and server.env["TMPDIR"] == server.scratch and Path(server.scratch).is_dir()
    for part in plan.parts[1:4]:
        Path(part.scratch or "").rmdir()
    assert plan.parts[5].after == ["worker", "vllm-0", "vllm-1", "vllm-2"]
    assert plan.model == "my-model"
    assert "instances:" in (directory / "inventory.yaml").read_text()


def test_the_local_key_is_kept_while_its_files_agree(tmp_path: Path) -> None:
    settings = Settings()
    first = local_key(tmp_path, settings).read_text()
    assert local_key(tmp_path, settings).read_text() == first
    assert oct((tmp_path / "api-key").stat().st_mode & 0o777) == "0o600"
    entry = load_keys(tmp_path / "api-keys.yaml")[0]
    assert entry.tenant == "local" and set(entry.slo_classes) == set(settings.slo_classes)
    (tmp_path / "api-keys.yaml").unlink()
    assert local_key(tmp_path, settings).read_text() != first


# -- state, report --------------------------------------------------------------------------------


def state_of(tmp_path: Path, **changes: object) -> StackState:
    fields: dict[str, object] = {
        "dir": str(tmp_path),
        "mode": "local",
        "phase": "ready",
        "supervisor_pid": 1,
        "supervisor_start": -1,
        "bootstrap": "127.0.0.1:9092",
        "gateway_url": "http://127.0.0.1:8000/v1",
        "model": "tiny-llama",
        "api_key_file": str(tmp_path / "api-key"),
        "clickhouse": "embedded: /data/clickhouse",
        "data_dir": "/data",
        "parts": [
            PartState("broker", "broker", "127.0.0.1:9092", "tcp://127.0.0.1:9092", str(tmp_path / "b.log"))
        ],
    }
    return StackState(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    state = state_of(tmp_path)
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    (tmp_path / "state.json").write_text("{not json")
    assert read_state(tmp_path) is None


def test_a_process_is_its_pid_and_start_time(tmp_path: Path) -> None:
    me = os.getpid()
    assert alive(me, start_time(me)) and not alive(me, (start_time(me) or 0) + 1) and not alive(None, None)
    # A recorded stack whose processes are gone leaves nothing over (pid 1 is not the same start).
    assert left_over(tmp_path, state_of(tmp_path)) == []


def test_the_snippet_is_python_with_the_key_and_model(tmp_path: Path) -> None:
    (tmp_path / "api-key").write_text("tf-abc\n")
    code = snippet(state_of(tmp_path))
    tree = ast.parse(code)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert {"http://127.0.0.1:8000/v1", "tf-abc", "tiny-llama"} <= strings
    assert "from openai import OpenAI" in code


def test_the_table_counts_each_parts_restarts_and_the_deciders(tmp_path: Path) -> None:
    from rich.console import Console

    parts = [
        PartState("dispatcher", "dispatcher", "http://d", "", "", restarts=2),
        PartState("worker", "worker", "http://w", "", "", restarts=1, child_restarts=3),
        PartState("gateway", "gateway", "http://g", "", "", child_restarts=0),
        PartState("gpu-0", "engine", "http://e", "", ""),
    ]
    out = Console(width=200, record=True)
    out.print(table(state_of(tmp_path, parts=parts), {}))
    cells = [line.split("│") for line in out.export_text().splitlines() if "│" in line]
    rows = {cell[1].strip(): cell[3].strip() for cell in cells}  # part -> restarts
    assert rows["dispatcher"] == "2" and rows["worker"] == "1 + decider 3" and rows["gateway"] == "0"
    assert rows["gpu-0"] == ""  # an inventory's engine is not the stack's to restart
    parts[1].restarts = 0
    out = Console(width=200, record=True)
    out.print(table(state_of(tmp_path, parts=parts), {}))
    assert "│ decider 3 " in out.export_text()


def test_a_worker_supervisors_child_restarts_are_read_from_its_ready_marker(tmp_path: Path) -> None:
    marker = tmp_path / "tokenfleet.worker.ready"
    assert child_restarts(marker, 4242) is None  # no child ready
    write_marker(marker, {"run": "r", "start": 3, "supervisor": 4242, "pid": 4300})
    assert child_restarts(marker, 4242) == 2
    assert child_restarts(marker, 4243) is None  # another supervisor's child


def test_the_table_names_a_configured_broker_and_the_store(tmp_path: Path) -> None:
    from rich.console import Console

    out = Console(width=200, record=True)
    out.print(table(state_of(tmp_path, parts=[]), {}))
    text = out.export_text()
    assert "configured" in text and "127.0.0.1:9092" in text and "embedded: /data/clickhouse" in text
