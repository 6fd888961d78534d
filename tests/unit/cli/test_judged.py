"""Violations from the command line: every ``simulate`` and ``capacity`` run given a fleet file
reports them (JSON and table), a workload may name several models and versions, and a signal
delay that makes every instance stale is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

TWO_MODELS = """\
data_centres:
  - name: A
    region: eu-a
    instances:
      - {count: 2, profile: llama3-8b-h100, model: llama3-8b, version: "2"}
      - {count: 1, profile: llama3-8b-h100, model: llama3-8b, version: "1"}
      - {count: 1, profile: qwen3-14b-h100, model: qwen3-14b, version: "1"}
models:
  llama3-8b: {version: "2"}
"""
WORKLOAD = "synthetic:duration_s=30,rate_per_s=3,batch_jobs_per_hour=0,models=llama3-8b+qwen3-14b@1"


def fleet_file(tmp_path: Path) -> str:
    path = tmp_path / "two-models.yaml"
    path.write_text(TWO_MODELS)
    return str(path)


def test_simulate_with_a_fleet_file_judges_a_workload_of_two_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama3-8b is pinned to "2" by the fleet file; TokenPilot alone (no DC stage reads the
    pins) also uses the "1" instance, FleetMind never; qwen3-14b requests name "1"."""
    out = tmp_path / "r.json"
    args = [
        "simulate",
        "--workload",
        WORKLOAD,
        "--fleet",
        fleet_file(tmp_path),
        "--quiet",
        "--json",
        str(out),
    ]
    assert (
        main([*args, "--policy", "tokenpilot", "--policy", "fleetmind+tokenpilot", "--policy", "ideal"]) == 0
    )
    table = capsys.readouterr().out
    assert "violations" in table.splitlines()[2]  # the first table's header
    results = json.loads(out.read_text())["results"]
    alone, fleetmind = results["tokenpilot"]["violations"], results["fleetmind+tokenpilot"]["violations"]
    assert alone["version"] > 0 and alone["total"] == alone["version"]
    assert fleetmind == {
        "permission": 0, "residency": 0, "version": 0, "model": 0, "not_ready": 0, "cut_off": 0, "total": 0,
    }  # fmt: skip
    assert "violations" not in results["ideal"]  # a bound is not a router


def test_a_fleet_spec_without_a_file_has_no_rules_to_judge(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["simulate", "--workload", "synthetic:duration_s=20", "--fleet", "2xllama3-8b-h100"]
    assert main([*args, "--policy", "least-tokens", "--quiet", "--json", str(out)]) == 0
    assert "violations" not in json.loads(out.read_text())["results"]["least-tokens"]


def test_capacity_with_a_fleet_file_reports_violations_at_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.json"
    args = ["capacity", "--workload", WORKLOAD, "--fleet", fleet_file(tmp_path), "--precision", "1"]
    assert (
        main([*args, "--policy", "fleetmind+tokenpilot", "--policy", "tokenpilot", "--json", str(out)]) == 0
    )
    table = capsys.readouterr().out
    assert "| probes | violations |" in table
    found = json.loads(out.read_text())
    assert found["capacity"]["fleetmind+tokenpilot"]["violations"]["total"] == 0
    assert all(p["violations"]["total"] == 0 for p in found["capacity"]["fleetmind+tokenpilot"]["probes"])
    assert found["capacity"]["tokenpilot"]["violations"]["version"] > 0
    assert found["compared_at"]["policies"]["tokenpilot"]["violations"]["version"] > 0


@pytest.mark.parametrize(
    ("command", "timing"),
    [
        ("simulate", ["--signal-delay", "0.6"]),
        ("simulate", ["--signal-delay", "0.5"]),  # exactly the window: a row read then is stale
        ("capacity", ["--signal-delay", "0.5"]),
        ("tail", ["--heartbeat", "0.1", "--signal-delay", "0.2"]),
    ],
)
def test_a_signal_delay_at_or_above_the_staleness_window_is_refused(
    capsys: pytest.CaptureFixture[str], command: str, timing: list[str]
) -> None:
    code = main(
        [command, "--workload", "synthetic:duration_s=10", "--policy", "fleetmind+tokenpilot", *timing]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"tokenfleet {command}: error: --signal-delay ")
    assert "staleness window" in err


def test_a_signal_delay_below_the_window_runs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--workload", "synthetic:duration_s=10", "--policy", "fleetmind+tokenpilot"]
    assert main([*args, "--signal-delay", "0.45", "--quiet"]) == 0
    assert main([*args, "--heartbeat", "1", "--signal-delay", "0.6", "--quiet"]) == 0


def test_an_unknown_or_bad_synthetic_model_list_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--policy", "tokenpilot", "--quiet", "--workload"]
    assert main([*args, "synthetic:duration_s=10,models=llama3-8b@"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "synthetic models must be" in err
