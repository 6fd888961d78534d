"""``tokenfleet simulate --profiles FILE``: the file's profiles join the built-in ones for the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

pytestmark = pytest.mark.unit

PROFILES = """profiles:
  my-engine:
    t0_s: 0.008
    prefill_s_per_token: 3.0e-05
    prefill_s_per_token_pair: 1.0e-09
    decode_s_per_seq: 4.0e-05
    decode_s_per_context_token: 8.0e-08
    kv_tokens: 300000
    price_per_hour: 2.0
    model: llama3-8b
  llama3-8b-h100: {t0_s: 0.1}   # ten times slower than the built-in one, for this run
"""
RUN = ["simulate", "--workload", "synthetic:duration_s=30,rate_per_s=2", "--policy", "round-robin", "--quiet"]


def one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("tokenfleet simulate: error: ")
    return err


def test_a_fleet_names_a_profile_of_the_file(tmp_path: Path) -> None:
    profiles, fleet, out = tmp_path / "profiles.yaml", tmp_path / "fleet.yaml", tmp_path / "r.json"
    profiles.write_text(PROFILES)
    fleet.write_text("data_centres:\n  - name: A\n    instances:\n      - {count: 2, profile: my-engine}\n")
    assert main([*RUN, "--fleet", str(fleet), "--profiles", str(profiles), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    result = document["results"]["round-robin"]
    assert result["completed"] > 0
    assert result["cost"] == pytest.approx(2 * 2.0 * document["window_s"] / 3600, rel=1e-3)  # its price


def test_a_profile_of_the_file_replaces_the_built_in_one_of_its_name(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    ttft = {}
    for extra in ([], ["--profiles", str(profiles)]):
        out = tmp_path / f"r{len(extra)}.json"
        assert main([*RUN, "--fleet", "1xllama3-8b-h100", *extra, "--json", str(out)]) == 0
        ttft[len(extra)] = json.loads(out.read_text())["results"]["round-robin"]["ttft_p50_s"]
    assert ttft[2] > 5 * ttft[0]


def test_without_the_file_the_profile_is_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown engine profile 'my-engine'" in one_line(capsys, main([*RUN, "--fleet", "2xmy-engine"]))


def test_a_bad_profiles_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n  x: {t0_s: -1}\n")
    assert f"{bad}: profile 'x'" in one_line(capsys, main([*RUN, "--profiles", str(bad)]))
    missing = tmp_path / "missing.yaml"
    assert "cannot read profiles file" in one_line(capsys, main([*RUN, "--profiles", str(missing)]))


def test_a_scenario_brings_its_own_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    err = one_line(capsys, main(["simulate", "--scenario", "hotspot", "--profiles", str(profiles)]))
    assert "drop --profiles" in err
