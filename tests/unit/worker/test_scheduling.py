"""The worker's stage parameters: FleetMind's rules from the fleet YAML, the heartbeat
interval, explicit parameters first; an unusable rules file is one line, at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.policy import build_scheduler
from agents.policy.fleetmind import FleetMind
from infra.settings import Settings
from worker.scheduling import dc_view, policy_params

ROOT = Path(__file__).resolve().parents[3]
RULES = "data_centres:\n  - {name: dc-a, region: eu}\ntenants:\n  resident: {regions: [eu]}\n"


def test_fleetmind_gets_the_rules_and_the_heartbeat_interval_under_explicit_params(tmp_path: Path) -> None:
    rules = tmp_path / "fleet.yaml"
    rules.write_text(RULES)
    settings = Settings(policy="fleetmind+least-tokens", fleet_rules=rules, heartbeat_interval_s=0.5)
    params = policy_params(settings)
    assert params["fleetmind"]["heartbeat_s"] == 0.5
    assert params["fleetmind"]["rules"]["tenants"] == {"resident": {"regions": ["eu"]}}
    stage = build_scheduler(settings.policy, params=params).dc_selection
    assert isinstance(stage, FleetMind)
    assert stage.stale_after_s == 1.0 and stage.rules.region_of("dc-a") == "eu"

    explicit = settings.model_copy(update={"policy_params": {"fleetmind": {"heartbeat_s": 2.0}}})
    assert policy_params(explicit)["fleetmind"]["heartbeat_s"] == 2.0  # explicit params win
    assert "rules" in policy_params(explicit)["fleetmind"]
    other = settings.model_copy(update={"policy": "least-tokens", "fleet_rules": tmp_path / "none.yaml"})
    assert policy_params(other) == {}  # no fleetmind stage: the file is not read


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "No such file"),
        ("data_centres: [\n", "is not valid YAML"),
        ("- dc-a\n", "must be a mapping"),
        ("tenants:\n  t: {cross_region: maybe}\n", "cross_region must be true or false"),
    ],
)
def test_an_unusable_rules_file_is_one_line_naming_it(
    tmp_path: Path, text: str | None, expected: str
) -> None:
    rules = tmp_path / "fleet.yaml"
    if text is not None:
        rules.write_text(text)
    with pytest.raises(ValueError, match=expected) as caught:
        policy_params(Settings(policy="fleetmind+tokenpilot", fleet_rules=rules))
    assert str(rules) in str(caught.value) and "\n" not in str(caught.value)


def test_the_worker_command_refuses_a_missing_rules_file_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    env = {**os.environ, "TOKENFLEET_FLEET_RULES": str(missing), "TOKENFLEET_DATA_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "cli.main", "worker", "--policy", "fleetmind+tokenpilot"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"tokenfleet worker: error: fleet rules '{missing}': No such file or directory\n")


def test_the_dc_view_has_the_settings_kv_links_and_round_trips() -> None:
    view = dc_view(Settings(dc_rtt_ms={"a": 2.0, "b": 40.0}, kv_link_gbps={"b": 100.0, "c": 400.0}))
    assert view.names == ("a", "b", "c") and view.rtt_s == (0.002, 0.04, 0.0)
    assert (view.link_gbps("a"), view.link_gbps("b"), view.link_gbps("c")) == (0.0, 100.0, 400.0)
    assert dc_view(Settings(dc_rtt_ms={"a": 2.0})).kv_link_gbps == ()  # no link anywhere
    with pytest.raises(ValueError, match="kv_link_gbps"):
        Settings(kv_link_gbps={"a": -1.0})
