"""Every file in ``examples/`` is loaded the way the product loads it, so a commented example
cannot drift from what the code accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.policy import build_scheduler
from agents.policy.registry import with_deployment
from cli.choices import load_policy_config
from infra.settings import Settings
from infra.vllm.inventory import load_inventory
from worker.scheduling import load_fleet_rules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_settings_file_is_read_and_the_environment_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFLEET_CONFIG", str(EXAMPLES / "tokenfleet.yaml"))
    monkeypatch.setenv("TOKENFLEET_TOPIC_PARTITIONS", "12")
    settings = Settings()
    assert settings.policy == "slomax+tokenpilot" and settings.pools == ["llama3-8b"]
    assert settings.topic_partitions == 12  # the environment wins over the file
    assert settings.slo()["interactive"].ttft_s == 2.0 and settings.slo()["batch"].deadline
    build_scheduler(settings.policy, params=settings.policy_params)  # its parameters are real


def test_a_settings_file_with_an_unknown_key_or_missing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("polcy: tokenpilot\n")
    monkeypatch.setenv("TOKENFLEET_CONFIG", str(bad))
    with pytest.raises(ValueError, match="polcy"):
        Settings()
    monkeypatch.setenv("TOKENFLEET_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ValueError, match="no such settings file"):
        Settings()


def test_the_inventory_example_loads() -> None:
    inventory = load_inventory(EXAMPLES / "inventory.yaml")
    assert [i.instance_id for i in inventory.instances] == ["gpu-a-0", "gpu-a-1"]
    assert inventory.instances[0].price_per_hour == 3.0 and inventory.instances[1].gpus == 1


def test_the_policy_example_names_real_parameters() -> None:
    params = load_policy_config(EXAMPLES / "policy.yaml")
    build_scheduler("slomax+tokenpilot", params=params)


def test_the_fleet_rules_example_is_valid_rules_for_fleetmind() -> None:
    rules = load_fleet_rules(EXAMPLES / "fleet-rules.yaml")
    params = with_deployment("fleetmind+tokenpilot", {}, 0.25, rules)
    build_scheduler("fleetmind+tokenpilot", params=params)
