"""``tokenfleet simulate`` end to end: JSON shape, determinism, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from infra.entrypoints.cli import main

ROOT = Path(__file__).resolve().parents[2]
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
        cmd = [sys.executable, "-m", "infra.entrypoints.cli", *ARGS, "--policy", "random", "--json", str(out)]
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
