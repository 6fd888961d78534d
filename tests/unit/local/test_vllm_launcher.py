"""The vLLM launcher's prefill/decode options, without starting a server: each server's KV
connector in the role its spec asks, the weights' load format, and an inventory that tells each
server's role and the model's KV bytes per token."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from local.vllm_launcher import VllmServers, VllmServerSpec, kv_bytes_per_token, server_specs

CONNECTOR = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": "/kv"}}


def model_dir(tmp_path: Path, **config: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def option(command: list[str], name: str) -> list[str]:
    """Every value ``command`` gives option ``name``."""
    return [command[i + 1] for i, word in enumerate(command) if word == name]


def test_each_server_gets_the_connector_in_its_role_and_the_load_format(tmp_path: Path) -> None:
    prefill, decode, both = server_specs(3, prefix="pd")
    specs = [replace(prefill, role="prefill"), replace(decode, role="decode"), both]
    servers = VllmServers(specs, tmp_path, tmp_path, load_format="safetensors", kv_connector=CONNECTOR)
    for spec, kv_role in zip(specs, ("kv_producer", "kv_consumer", "kv_both"), strict=True):
        command = servers.command("python", spec)
        assert spec.kv_role == kv_role
        assert option(command, "--load-format") == ["safetensors"]
        (config,) = option(command, "--kv-transfer-config")
        assert json.loads(config) == {**CONNECTOR, "kv_role": kv_role}


def test_without_a_connector_a_server_has_random_weights_and_no_kv_transfer(tmp_path: Path) -> None:
    (spec,) = server_specs(1)
    command = VllmServers([spec], tmp_path, tmp_path).command("python", spec)
    assert option(command, "--load-format") == ["dummy"] and "--kv-transfer-config" not in command


def test_a_role_is_one_of_three_and_the_connector_does_not_name_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefill, decode, both"):
        VllmServerSpec("x", 1, 2, 3, 0, role="kv_producer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_role"):
        VllmServers(server_specs(1), tmp_path, tmp_path, kv_connector={**CONNECTOR, "kv_role": "kv_both"})


def test_kv_bytes_per_token_is_keys_and_values_of_every_layer_in_float32(tmp_path: Path) -> None:
    grouped = model_dir(
        tmp_path, num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2
    )
    assert kv_bytes_per_token(grouped) == 2 * 2 * 2 * 64 * 4
    (tmp_path / "explicit").mkdir()
    explicit = model_dir(tmp_path / "explicit", num_hidden_layers=3, num_attention_heads=4, head_dim=32)
    assert kv_bytes_per_token(explicit) == 2 * 3 * 4 * 32 * 4  # no KV-head count: every head
    assert kv_bytes_per_token(tmp_path / "nothing-here") == 0


def test_the_inventory_tells_each_servers_role_kv_size_and_scheduler_limits(tmp_path: Path) -> None:
    model = model_dir(tmp_path, num_hidden_layers=2, hidden_size=256, num_attention_heads=4)
    first, second = server_specs(2)
    servers = VllmServers([replace(first, role="prefill"), second], model, tmp_path, max_num_seqs=8)
    found = [(i.role, i.kv_bytes_per_token) for i in servers.inventory().instances]
    assert found == [("prefill", 4096), ("both", 4096)]
    command = servers.command("python", first)
    limits = (option(command, "--max-num-seqs"), option(command, "--max-num-batched-tokens"))
    declared = {(i.max_num_seqs, i.max_num_batched_tokens) for i in servers.inventory().instances}
    assert declared == {(int(limits[0][0]), int(limits[1][0]))} == {(8, 2048)}
