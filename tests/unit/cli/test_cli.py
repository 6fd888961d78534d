"""``tokenfleet simulate`` end to end: JSON shape, determinism, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[3]
MOONCAKE = str(ROOT / "sim" / "traces" / "mooncake" / "conversation_trace.jsonl")
KEYS = {
    "completed", "rejected", "aborted", "retried", "wasted_tokens", "ttft_p50_s", "ttft_p95_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p95_s", "e2e_p95_s", "cache_hit_ratio", "output_tokens_per_s",
    "goodput_tokens_per_s", "compliant_share", "busy_fraction",
}  # fmt: skip
ARGS = [
    "simulate", "--workload", "synthetic:duration_s=120,rate_per_s=6", "--fleet", "2xllama3-8b-h100",
    "--policy", "least-tokens", "--policy", "dynamo-kv", "--policy", "ideal", "--seed", "4", "--quiet",
]  # fmt: skip


def test_json_has_every_key_per_policy_and_class(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main([*ARGS, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["workload"] and doc["fleet"] == "2xllama3-8b-h100"
    assert set(doc["results"]) == {"least-tokens", "dynamo-kv", "ideal"}
    for result in doc["results"].values():
        assert set(result) >= KEYS
        for per_class in result["per_class"].values():
            assert set(per_class) >= KEYS


def test_same_seed_same_json_across_processes(tmp_path: Path) -> None:
    """Byte-identical JSON from two processes with different string-hash seeds."""
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        cmd = [sys.executable, "-m", "cli.main", *ARGS, "--policy", "random", "--json", str(out)]
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_bad_input_is_reported_with_exit_code_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "--workload", MOONCAKE, "--policy", "round-robin", "--fleet", "8xnope"]) == 2
    assert "unknown engine profile 'nope'" in capsys.readouterr().err
    assert main(["simulate", "--workload", "/no/such/file.jsonl", "--policy", "round-robin"]) == 2
    assert "workload file not found" in capsys.readouterr().err


def test_fleet_yaml_with_data_centres(tmp_path: Path) -> None:
    from sim.engine.fleet import parse_fleet

    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        "data_centres:\n"
        "  - name: us-east\n    instances:\n      - {count: 2, profile: llama3-8b-h100, version: '3'}\n"
        "  - name: eu-west\n    instances:\n      - {count: 1, profile: qwen3-14b-h100, model: llama3-8b}\n"
        "rtt_ms:\n  us-east: {eu-west: 80}\n"
    )
    fleet = parse_fleet(str(spec))
    assert [i.dc for i in fleet.instances] == ["us-east", "us-east", "eu-west"]
    assert fleet.instances[0].version == "3" and fleet.instances[2].profile.name == "qwen3-14b-h100"
    assert fleet.rtt("eu-west", "us-east") == 0.08
    assert main(["simulate", "--workload", "synthetic:duration_s=60", "--fleet", str(spec),
                 "--policy", "least-tokens", "--quiet"]) == 0  # fmt: skip


def test_the_fleet_cache_bound_lies_between_unlimited_cache_and_the_policies(tmp_path: Path) -> None:
    out = tmp_path / "bounds.json"
    code = main(
        ["simulate", "--workload", MOONCAKE, "--fleet", "2xllama3-8b-h100", "--rate-scale", "0.25",
         "--policy", "ideal", "--policy", "ideal-fleet-cache", "--policy", "least-tokens", "--quiet",
         "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    r = json.loads(out.read_text())["results"]
    assert r["ideal"]["cache_hit_ratio"] > r["ideal-fleet-cache"]["cache_hit_ratio"]
    assert r["ideal"]["ttft_p50_s"] <= r["ideal-fleet-cache"]["ttft_p50_s"] <= r["least-tokens"]["ttft_p50_s"]


SMALL = ["simulate", "--workload", "synthetic:duration_s=60", "--fleet", "2xllama3-8b-h100", "--quiet"]


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The single stderr line of a run that must fail with exit code 2."""
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Usage" not in err, err
    assert err.startswith("tokenfleet simulate: error: ")
    return err


def test_an_unknown_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--bogus" in _one_line_error(capsys, main([*SMALL, "--policy", "least-tokens", "--bogus"]))
    assert "'--seed'" in _one_line_error(capsys, main([*SMALL, "--policy", "least-tokens", "--seed", "x"]))
    assert "'--policy'" in _one_line_error(capsys, main(SMALL))


def test_an_unknown_policy_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(capsys, main([*SMALL, "--policy", "least-tokens", "--policy", "pass-through+nope"]))
    assert "unknown stage 'nope'" in err and "tokenpilot" in err and "ideal-fleet-cache" in err


def test_the_error_of_a_subprocess_is_one_line() -> None:
    cmd = [sys.executable, "-m", "cli.main", "simulate", "--workload", "synthetic", "--nope"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "tokenfleet simulate: error: No such option: --nope\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "No such file"),
        ("tokenpilot: {tie_tolerance: [0.05\n", "not valid YAML"),
        ("- tokenpilot\n", "must map stage names to parameter mappings"),
        ("tokenpilot: 0.05\n", "stage 'tokenpilot' must map"),
        ("", "must map stage names"),
    ],
)
def test_a_bad_policy_config_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | None, expected: str
) -> None:
    config = tmp_path / "policy.yaml"
    if text is not None:
        config.write_text(text)
    code = main([*SMALL, "--policy", "tokenpilot", "--policy-config", str(config)])
    assert expected in _one_line_error(capsys, code)


def test_the_policy_config_reaches_the_simulation(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("tokenpilot: {tie_dolerance: 0.05}\n")
    err = _one_line_error(capsys, main([*SMALL, "--policy", "tokenpilot", "--policy-config", str(config)]))
    assert "unknown parameter tie_dolerance for stage 'tokenpilot'" in err and "tie_tolerance" in err
    config.write_text("dynamo-kv: {}\n")
    err = _one_line_error(capsys, main([*SMALL, "--policy", "tokenpilot", "--policy-config", str(config)]))
    assert "parameters for dynamo-kv, which no policy compared here uses" in err

    documents: list[dict[str, Any]] = []
    for name, tolerance in (("default", None), ("wide", 1e9)):
        out = tmp_path / f"{name}.json"
        args = [*SMALL, "--policy", "pass-through+home-dc+tokenpilot", "--policy", "least-tokens",
                "--policy", "ideal", "--json", str(out)]  # fmt: skip
        if tolerance is not None:  # every candidate within tolerance: a random choice among all
            config.write_text(f"tokenpilot: {{tie_tolerance: {tolerance}}}\n")
            args += ["--policy-config", str(config)]
        assert main(args) == 0
        documents.append(json.loads(out.read_text())["results"])
    assert documents[0]["ideal"] == documents[1]["ideal"]
    assert documents[0]["least-tokens"] == documents[1]["least-tokens"]  # takes none of it
    key = "pass-through+home-dc+tokenpilot"
    assert documents[0][key]["ttft_p95_s"] != documents[1][key]["ttft_p95_s"]


def test_tables_on_stdout_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--workload", "synthetic:duration_s=60", "--fleet", "2xllama3-8b-h100",
            "--policy", "least-tokens", "--policy", "ideal"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith(
        "workload synthetic:duration_s=60 | fleet 2xllama3-8b-h100 | rate x1.0 | seed 0"
    )
    header = lines[2].split()
    assert header[:2] == ["all", "requests"] and header[-2:] == ["err", "p50/ideal"]
    least, ideal = lines[4].split(), lines[5].split()
    assert least[0] == "least-tokens" and ideal[0] == "ideal" and ideal[-1] == "1.00x"
    assert len(least) == len(ideal) == len(header) - 6  # six headers are two words
    assert least[11].endswith("%") and least[6].count(".") == 1 and len(least[6].split(".")[1]) == 3
    # stderr is not a terminal here: one line per simulated policy, then the timings
    assert "simulating least-tokens:" in captured.err and "ideal:" in captured.err
    assert "simulating" not in captured.out


def _error_line(capsys: pytest.CaptureFixture[str], code: int, command: str) -> str:
    """The single stderr line of a run of ``command`` that must fail with exit code 2."""
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Usage" not in err, err
    assert err.startswith(f"tokenfleet {command}: error: "), err
    return err


@pytest.mark.parametrize(
    "line",
    [
        "[1, 2, 3]",
        '{"timestamp": NaN, "input_length": 10, "output_length": 1}',
        '{"timestamp": Infinity, "input_length": 10, "output_length": 1}',
        '{"timestamp": 1e300, "input_length": 10, "output_length": 1}',
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "deadline_s": -1}',
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "max_tokens": 0}',
        '{"timestamp": 0, "input_length": -4, "output_length": 1}',
    ],
)
def test_a_bad_trace_line_is_one_line_naming_file_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n' + line + "\n")
    args = [
        "simulate",
        "--workload",
        str(trace),
        "--fleet",
        "1xllama3-8b-h100",
        "--policy",
        "least-tokens",
        "--quiet",
    ]
    err = _one_line_error(capsys, main(args))
    assert f"{trace}:2: " in err
    assert "field" in err or "JSON object" in err


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--heartbeat", "0"),
        ("--heartbeat", "-1"),
        ("--heartbeat", "nan"),
        ("--heartbeat", "inf"),
        ("--retry-share", "5"),
        ("--retry-share", "-0.1"),
        ("--retry-share", "nan"),
        ("--rate-scale", "0"),
        ("--rate-scale", "-2"),
        ("--rate-scale", "nan"),
        ("--rate-scale", "inf"),
        ("--seed", "-1"),
        ("--output-budget", "0"),
        ("--output-budget", "-5"),
        ("--deciders", "0"),
        ("--deciders", "65"),
        ("--decision-log-delay", "-0.001"),
        ("--decision-log-delay", "nan"),
    ],
)
def test_a_simulate_number_out_of_range_is_one_line(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    err = _one_line_error(capsys, main([*SMALL, "--policy", "least-tokens", option, value]))
    assert f"Invalid value for '{option}'" in err and value in err


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("generate", ["generate", "--out", "OUT", "--duration", "0"]),
        ("generate", ["generate", "--out", "OUT", "--duration", "nan"]),
        ("generate", ["generate", "--out", "OUT", "--duration", "-3"]),
        ("generate", ["generate", "--out", "OUT", "--rate", "0"]),
        ("generate", ["generate", "--out", "OUT", "--rate", "nan"]),
        ("generate", ["generate", "--out", "OUT", "--rate", "inf"]),
        ("generate", ["generate", "--out", "OUT", "--seed", "-1"]),
        ("generate", ["generate", "--out", "OUT", "--rate", "1e5", "--duration", "1e7"]),
        ("loadgen", ["loadgen", "--workload", "synthetic", "--duration", "0"]),
        ("loadgen", ["loadgen", "--workload", "synthetic", "--duration", "nan"]),
        ("loadgen", ["loadgen", "--workload", "synthetic", "--rate-scale", "-1"]),
        ("loadgen", ["loadgen", "--workload", "synthetic", "--seed", "-1"]),
        ("fleet", ["fleet", "--speed", "0"]),
        ("fleet", ["fleet", "--speed", "-1"]),
        ("fleet", ["fleet", "--speed", "nan"]),
    ],
)
def test_numbers_out_of_range_are_one_line_for_every_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, args: list[str]
) -> None:
    out = tmp_path / "out.jsonl"
    code = main([str(out) if a == "OUT" else a for a in args])
    _error_line(capsys, code, command)
    assert not out.exists()


def test_a_huge_fleet_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(
        capsys, main([*SMALL[:3], "--fleet", "100000000xllama3-8b-h100", "--policy", "least-tokens"])
    )
    assert "at most 100000 instances" in err


def test_arrivals_at_one_instant_have_goodput(tmp_path: Path) -> None:
    trace = tmp_path / "instant.jsonl"
    trace.write_text(
        "".join(f'{{"timestamp": 0, "input_length": {n}, "output_length": 30}}\n' for n in (500, 800))
    )
    out = tmp_path / "r.json"
    args = ["simulate", "--workload", str(trace), "--fleet", "1xllama3-8b-h100", "--policy", "least-tokens",
            "--policy", "ideal", "--quiet", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    for result in json.loads(out.read_text())["results"].values():
        assert result["completed"] == 2 and result["goodput_tokens_per_s"] > 0
        assert result["compliant_share"] == 1.0


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", "")
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))


BATCH_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'


@pytest.mark.usefixtures("no_broker")
def test_publishing_without_a_broker_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(BATCH_LINE)
    err = _error_line(capsys, main(["batch", "submit", str(batch), "--deadline", "30m"]), "batch submit")
    assert "TOKENFLEET_KAFKA_BOOTSTRAP" in err and "--embedded" in err
    err = _error_line(capsys, main(["loadgen", "--workload", "synthetic:duration_s=5"]), "loadgen")
    assert "TOKENFLEET_KAFKA_BOOTSTRAP" in err and "--embedded" in err
    assert not (tmp_path / "data").exists()  # no embedded broker was started


@pytest.mark.usefixtures("no_broker")
def test_embedded_publishes_and_warns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import contextlib
    from collections.abc import Iterator

    import infra.kafka.bus
    import traffic.loadgen
    from infra.kafka.connection import KafkaConnection

    started: list[str] = []

    @contextlib.contextmanager
    def fake_connection(settings: Any) -> Iterator[Any]:
        started.append(settings.kafka_bootstrap)
        yield KafkaConnection.plaintext("127.0.0.1:1")

    async def fake_publish(connection: Any, workload: Any, **kwargs: Any) -> int:
        return len(workload.requests)

    async def fake_publish_batch(connection: Any, job: Any) -> None:
        pass

    monkeypatch.setattr(infra.kafka.bus, "kafka_connection", fake_connection)
    monkeypatch.setattr(traffic.loadgen, "publish_workload", fake_publish)
    monkeypatch.setattr(traffic.loadgen, "publish_batch", fake_publish_batch)
    assert main(["loadgen", "--workload", "synthetic:duration_s=5", "--embedded", "--fast"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("published ") and "lost when the command exits" in captured.err
    batch = tmp_path / "batch.jsonl"
    batch.write_text(BATCH_LINE)
    assert main(["batch", "submit", str(batch), "--deadline", "30m", "--embedded"]) == 0
    captured = capsys.readouterr()
    assert (
        captured.out.startswith("submitted batch job job-") and "lost when the command exits" in captured.err
    )
    assert started == ["", ""]


@pytest.mark.parametrize("deadline", ["0s", "nope", "9" * 400])
def test_a_bad_batch_deadline_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, deadline: str
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(BATCH_LINE)
    err = _error_line(capsys, main(["batch", "submit", str(batch), "--deadline", deadline]), "batch submit")
    assert "invalid duration" in err and len(err) < 300


def test_tail_analyses_a_policy_and_refuses_a_bound(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``tokenfleet tail``: its JSON per policy; a latency bound, a missing file or policy is one
    line and exit 2."""
    out = tmp_path / "tail.json"
    small = ["tail", "--workload", "synthetic:duration_s=60", "--fleet", "2xllama3-8b-h100"]
    assert main([*small, "--policy", "tokenpilot", "--json", str(out)]) == 0
    (tail,) = json.loads(out.read_text())["tails"]
    assert tail["policy"] == "tokenpilot" and tail["requests"] > 0
    assert set(tail["ttft_s"]) == {"p50", "p95", "p99"}
    # Restoring caches can only make a request faster, so no quantile rises.
    for restored in ("rerouted_ttft_s", "restored_ttft_s"):
        assert all(tail[restored][q] <= tail["ttft_s"][q] for q in ("p50", "p95", "p99"))
    capsys.readouterr()
    for args, says in (
        ([*small, "--policy", "ideal"], "ideal is a latency bound"),
        (["tail", "--workload", "/no/such/file.jsonl", "--policy", "tokenpilot"], "workload file not found"),
        (small, "'--policy'"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("tokenfleet tail: error: ") and says in err, err


def test_a_misspelt_query_is_named_not_sent_to_write_mode(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error_line(capsys, main(["sql", "SELEC 1"]), "sql")
    assert "did you mean SELECT" in err and "--write" not in err
    err = _error_line(capsys, main(["sql", "DROP TABLE completions"]), "sql")
    assert "pass --write" in err


def test_the_command_lines_token_bound_is_the_wires() -> None:
    from cli.options import MAX_TOKENS
    from schemas.events import MAX_TOKENS as WIRE_MAX_TOKENS

    assert MAX_TOKENS == WIRE_MAX_TOKENS


@pytest.mark.usefixtures("no_broker")
def test_services_never_start_a_private_broker_and_name_a_bad_inventory_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = _error_line(capsys, main(["fleet"]), "fleet")
    assert "no Kafka broker configured" in err
    err = _error_line(capsys, main(["gateway", "--inventory", str(tmp_path / "absent.yaml")]), "gateway")
    assert "cannot read the inventory" in err  # not hidden behind the missing broker
    assert not (tmp_path / "data").exists()  # no embedded broker was started


@pytest.mark.parametrize("content", [None, "not json at all\n", ""])
def test_batch_submit_names_a_bad_file_before_looking_for_the_broker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: str | None
) -> None:
    import infra.kafka.broker

    looked: list[object] = []
    monkeypatch.setattr(infra.kafka.broker, "require_reachable", lambda *a, **k: looked.append(a))
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", "127.0.0.1:9")
    batch = tmp_path / "jobs.jsonl"
    if content is not None:
        batch.write_text(content)
    err = _error_line(capsys, main(["batch", "submit", str(batch), "--deadline", "30m"]), "batch submit")
    assert "jobs.jsonl" in err and looked == []


def test_a_store_another_process_holds_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The embedded engine's lock (an exclusive flock on DIR/status, as the running worker holds
    it) is named before the engine is opened; tests/integration/test_clickhouse.py holds a real one."""
    store = tmp_path / "data" / "clickhouse"
    store.mkdir(parents=True)
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("TOKENFLEET_CLICKHOUSE_DSN", raising=False)
    hold = (
        "import fcntl, sys; f = open(sys.argv[1], 'ab'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print(1, flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(store / "status")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"1\n"
        for command, args in (("sql", ["sql", "SELECT 1"]), ("slomax status", ["slomax", "status"])):
            err = _error_line(capsys, main(args), command)
            assert f"the embedded store {store} is held by a running process" in err
            assert "tokenfleet down" in err and "TOKENFLEET_CLICKHOUSE_DSN" in err
    finally:
        holder.communicate(b"", timeout=30)


def test_an_unreachable_broker_is_one_line_within_ten_seconds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.kafka.broker import free_port

    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")  # nobody listens
    started = time.monotonic()
    err = _error_line(capsys, main(["loadgen", "--workload", "synthetic:duration_s=5"]), "loadgen")
    assert "no Kafka broker answers at 127.0.0.1:" in err and time.monotonic() - started < 10


def test_several_deciders_per_pool_are_simulated_and_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    args = [
        *SMALL,
        "--policy",
        "tokenpilot",
        "--deciders",
        "2",
        "--decider-split",
        "random",
        "--json",
        str(out),
    ]
    assert main(args) == 0
    assert "2 deciders per pool (random split, log 5 ms late)" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert (doc["deciders"], doc["decider_split"], doc["decision_log_delay_s"]) == (2, "random", 0.005)
    assert main([*SMALL, "--policy", "tokenpilot", "--decider-split", "sideways"]) == 2


def test_planners_are_compared_each_result_keyed_and_named_by_its_planner(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    args = [
        *SMALL,
        "--policy",
        "tokenpilot",
        "--planner",
        "static",
        "--planner",
        "fleetmind",
        "--json",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "fleet shape" in printed and "lost in scale-down" in printed
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"tokenpilot@static", "tokenpilot@fleetmind"}
    for key, result in results.items():
        assert result["planner"] == key.split("@")[1]
        assert result["lost_in_scale_down"] == 0 and result["gpu_hours"] > 0
        assert {"t_s", "pools", "demand_per_s"} <= set(result["timeline"])
    assert results["tokenpilot@static"]["replica_starts"] == 0
    err = _error_line(capsys, main([*SMALL, "--policy", "tokenpilot", "--planner", "keda"]), "simulate")
    assert "unknown planner 'keda'; known: static, hpa, dynamo-sla, fleetmind" in err
