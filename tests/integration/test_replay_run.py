"""``tokenfleet replay --run RUN --policy P ...`` against the real embedded ClickHouse engine (chdb):
a run the simulator made (round-robin, on engines slower than the built-in profile they are named
after, following the nominal law) is stored as the stack stores one; the replay calibrates the
engines from it and predicts the run that happened, and another policy beside it; on the profiles
``replay calibrate --out F`` wrote (``--profiles F``), it predicts exactly the same."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from cli.main import main
from infra.clickhouse import FeedbackSink, connect, migrate
from lab.simulated_store import heartbeats, request_event, store_run
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.sources import open_workload

LLAMA = PROFILES["llama3-8b-h100"]
TRUTH = replace(
    LLAMA,
    name="vllm",
    t0_s=1.3 * LLAMA.t0_s,
    decode_s_per_context_token=1.2 * LLAMA.decode_s_per_context_token,
)
"""The engines of the stored run: the nominal law, slower than the built-in profile of their
model; their heartbeats name the profile ``vllm`` (a real engine's, no built-in one)."""
WORKLOAD = "synthetic:duration_s=60,rate_per_s=8,share_doc_qa=0,batch_jobs_per_hour=0"


def test_the_replay_predicts_the_run_that_happened_and_the_other_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = FleetSpec("2", tuple(InstanceSpec(f"i{k}", "A", "llama3-8b", "1", TRUTH) for k in range(2)))
    trace = open_workload(WORKLOAD, seed=3)
    result = simulate(trace, fleet, "round-robin", SimConfig(seed=3))
    url = f"chdb:///{tmp_path / 'clickhouse'}"
    origin = float(int(time.time()) - 900)  # recent (heartbeats are kept 7 days), on whole seconds
    with connect(url) as client:  # closed before the command opens the store (one engine path)
        migrate(client)
        store_run(client, result, fleet, "run-rr", origin)
        store_without_completions(client, result.attempts[:3], fleet, origin)
    monkeypatch.setenv("TOKENFLEET_CLICKHOUSE_DSN", url)
    out = tmp_path / "replay.json"
    assert main(["replay", "--run", "run-rr", "--policy", "tokenpilot", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the policy that ran: round-robin" in printed and "predicted beside observed" in printed

    document = json.loads(out.read_text())
    assert set(document) >= {
        "run",
        "policy_ran",
        "workload",
        "calibration",
        "observed",
        "results",
        "self_error",
    }
    assert (document["run"], document["policy_ran"]) == ("run-rr", "round-robin")
    assert document["workload"] == {"requests": len(trace.requests), "without_hashes": 0, "left_out": 0}
    assert list(document["results"]) == ["tokenpilot", "round-robin"]  # the one that ran, added
    fitted = document["calibration"]["vllm"]  # the name the heartbeats gave
    assert fitted["parameters"]["t0_s"] == pytest.approx(TRUTH.t0_s, rel=0.02)
    assert fitted["parameters"]["decode_s_per_context_token"] == pytest.approx(
        TRUTH.decode_s_per_context_token, rel=0.05
    )
    assert fitted["residual_error"]["ttft"] < 0.05 and fitted["residual_error"]["prior_ttft"] > 0.1
    observed = document["observed"]
    assert observed["requests"] == len(trace.requests) and "interactive" in observed["per_class"]
    assert observed["cost_per_million_goodput_tokens"] is not None
    errors = document["self_error"]
    assert set(errors) == {"goodput", "ttft_p50", "ttft_p95", "compliant_share"}
    # The store measures the run as the simulator does (infra/clickhouse/summary.py).
    assert abs(errors["goodput"]) <= 0.01 and abs(errors["compliant_share"]) <= 0.02, errors
    assert abs(errors["ttft_p50"]) <= 0.03 and abs(errors["ttft_p95"]) <= 0.03, errors
    predicted = document["results"]["round-robin"]["ttft_p50_s"]
    assert errors["ttft_p50"] == pytest.approx(predicted / observed["ttft_p50_s"] - 1, abs=1e-4)

    # The same fit, written by calibrate and read back: the same replay, figure for figure.
    profiles, again = tmp_path / "profiles.yaml", tmp_path / "again.json"
    assert main(["replay", "calibrate", "--run", "run-rr", "--out", str(profiles)]) == 0
    args = ["--run", "run-rr", "--profiles", str(profiles), "--policy", "tokenpilot", "--json", str(again)]
    assert main(["replay", *args]) == 0
    assert f"from {profiles} (not fitted again): vllm" in capsys.readouterr().out
    on_file = json.loads(again.read_text())
    for key in ("results", "self_error", "observed", "workload", "policy_ran"):
        assert on_file[key] == document[key], key
    assert on_file["calibration"] == {
        "vllm": {"profiles_file": str(profiles), "model": "llama3-8b", "parameters": fitted["parameters"]}
    }

    # Three draws: the first is the replay above; the self error is the medians'.
    drawn = tmp_path / "drawn.json"
    args = ["--run", "run-rr", "--profiles", str(profiles), "--policy", "tokenpilot", "--draws", "3"]
    assert main(["replay", *args, "--json", str(drawn)]) == 0
    assert "over the 3 draws (seeds 0-2)" in capsys.readouterr().out
    three = json.loads(drawn.read_text())
    assert three["results"] == document["results"] and three["draws"]["seeds"] == [0, 1, 2]
    for spreads in three["draws"]["figures"].values():
        goodput = spreads["goodput_tokens_per_s"]
        assert goodput["min"] <= goodput["median"] <= goodput["max"]
    median = three["draws"]["figures"]["round-robin"]["ttft_p50_s"]["median"]
    assert three["self_error"]["ttft_p50"] == pytest.approx(median / observed["ttft_p50_s"] - 1, abs=1e-4)

    for run, policy, message in [
        ("run-rr", "nope", "unknown stage 'nope' in policy 'nope'; known stages: "),
        ("no-such-run", "tokenpilot", "no run 'no-such-run' in the store"),
        ("run-empty", "tokenpilot", "run 'run-empty' has no completions in the store"),
    ]:
        assert main(["replay", "--run", run, "--policy", policy]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tokenfleet replay: error: {message}") and err.count("\n") == 1, err
    # A profiles file without the run's engines: the group it lacks, named on one line.
    other = tmp_path / "other.yaml"
    other.write_text("profiles:\n  llama3-8b-h100: {t0_s: 0.01}\n")
    assert main(["replay", "--run", "run-rr", "--profiles", str(other), "--policy", "tokenpilot"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"tokenfleet replay: error: {other} has no profile for the instances of llama3-8b named 'vllm' "
        "(run 'run-rr') and no built-in profile describes them\n"
    )


def store_without_completions(
    client: Client, attempts: list[Attempt], fleet: FleetSpec, origin: float
) -> None:
    """Run ``run-empty``: the requests of ``attempts`` and heartbeats, and no completion."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-empty")
    sink.write_requests([request_event(a, "llama3-8b", origin) for a in attempts])
    sink.write_heartbeats(heartbeats([], fleet, origin, 2.0))
