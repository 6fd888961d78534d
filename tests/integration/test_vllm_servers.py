"""The real vLLM servers the integration tests and the demo run: they start, serve the tiny model
through its tokenizer and chat template, meter themselves, publish KV events, die when killed,
and come back; the tiny model's files are reproducible."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import zmq
from tokenizers import Tokenizer

from local.tiny_model import ensure_tiny_model, train_tokenizer
from local.vllm_launcher import VllmServers, VllmServerSpec, VllmStartError, free_ports, server_specs
from tests.integration.vllm_servers import MODEL

LABELS = f'{{engine="0",model_name="{MODEL}"}}'


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return int(response.status), response.read().decode()


def post(url: str, body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.load(response)
    return result


def tokenizer(servers: VllmServers) -> Tokenizer:
    return Tokenizer.from_file(str(servers.model_dir / "tokenizer.json"))


def metric(text: str, line_start: str) -> float:
    found = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    assert found, f"no metric line starting with {line_start!r}"
    return float(found[0].rsplit(" ", 1)[1])


@pytest.fixture
def pair(vllm_pair: VllmServers) -> VllmServers:
    """The session's ``vllm_pair`` (from the conftest), a server an earlier test killed restarted."""
    vllm_pair.revive()
    return vllm_pair


def group_members(group: int | None) -> list[int]:
    """The live (not zombie) processes of process group ``group``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
            if int(pgrp) == group and state not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def launched_under(data_dir: Path) -> list[int]:
    """Live processes started for servers of ``data_dir``: their TMPDIR (inherited by every
    process a server spawns) is inside it."""
    marker = f"TMPDIR={data_dir.resolve()}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X") and any(v.startswith(marker) for v in environ.split(b"\0")):
                found.append(int(entry.name))
    return found


def test_both_servers_are_healthy_and_list_the_model(pair: VllmServers) -> None:
    assert [s.instance_id for s in pair.specs] == ["vllm-0", "vllm-1"]
    assert sorted({s.core for s in pair.specs}) == sorted(os.sched_getaffinity(0))[:2]
    for spec in pair.specs:
        assert get(f"{spec.url}/health")[0] == 200
        models = json.loads(get(f"{spec.url}/v1/models")[1])
        assert [m["id"] for m in models["data"]] == [MODEL]
        assert models["data"][0]["max_model_len"] == 4096


def test_inventory_describes_the_servers(pair: VllmServers) -> None:
    inventory = pair.inventory()
    assert inventory.models[MODEL].tokenizer == pair.model_dir
    for spec, entry in zip(pair.specs, inventory.instances, strict=True):
        assert (entry.instance_id, entry.url, entry.model, entry.served_model_name) == (
            spec.instance_id,
            f"http://127.0.0.1:{spec.port}",
            MODEL,
            MODEL,
        )
        assert entry.kv_events == f"tcp://127.0.0.1:{spec.kv_events_port}"
        assert entry.kv_replay == f"tcp://127.0.0.1:{spec.kv_replay_port}"


def test_completion_generates_the_tokens_asked_for(pair: VllmServers) -> None:
    prompt = "The scheduler routes each request to the instance holding its prefix."
    result = post(
        f"{pair.url('vllm-0')}/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True},
    )
    assert result["usage"]["completion_tokens"] == 8
    # No BOS is added: the engine's prompt is exactly what the model's tokenizer makes of it.
    assert result["usage"]["prompt_tokens"] == len(tokenizer(pair).encode(prompt).ids)
    assert result["choices"][0]["finish_reason"] == "length"


def test_chat_completion_renders_the_chat_template(pair: VllmServers) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    result = post(
        f"{pair.url('vllm-1')}/v1/chat/completions",
        {"model": MODEL, "messages": messages, "max_tokens": 4, "ignore_eos": True},
    )
    assert result["choices"][0]["message"]["role"] == "assistant"
    assert result["usage"]["completion_tokens"] == 4
    rendered = "<|system|>\nBe brief.</s>\n<|user|>\nHello!</s>\n<|assistant|>\n"
    assert result["usage"]["prompt_tokens"] == len(tokenizer(pair).encode(rendered).ids)


def test_metrics_expose_load_cache_usage_and_prefix_hits(pair: VllmServers) -> None:
    url = pair.url("vllm-0")
    prompt = "def route(request, instances):\n    return min(instances, key=load)\n" * 12  # > 4 blocks
    assert len(tokenizer(pair).encode(prompt).ids) > 4 * 32
    before = metric(get(f"{url}/metrics")[1], f"vllm:prefix_cache_hits_total{LABELS}")
    for _ in range(2):  # the second one finds the first one's full blocks cached
        post(f"{url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True})
    text = get(f"{url}/metrics")[1]
    assert metric(text, f"vllm:prefix_cache_hits_total{LABELS}") >= before + 4 * 32
    assert metric(text, f"vllm:num_requests_running{LABELS}") == 0
    assert 0 <= metric(text, f"vllm:kv_cache_usage_perc{LABELS}") <= 1
    info = re.search(r"^vllm:cache_config_info\{(.*)\} 1\.0$", text, re.MULTILINE)
    assert info, "vllm:cache_config_info is missing"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    assert labels["block_size"] == "32"
    assert labels["num_gpu_blocks"] == "256"
    assert labels["enable_prefix_caching"] == "True"


def test_kv_events_are_published_on_the_inventory_endpoint(pair: VllmServers) -> None:
    entry = pair.inventory().instance("vllm-1")
    assert entry is not None and entry.kv_events is not None
    context = zmq.Context.instance()
    subscriber = context.socket(zmq.SUB)
    try:
        subscriber.connect(entry.kv_events)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"kv")
        time.sleep(0.5)  # a PUB socket drops what it sends before the subscription reaches it
        prompt = f"kv events {time.time_ns()}: " + "block " * 80
        post(f"{entry.url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
        assert subscriber.poll(10_000), "no KV event within 10 s"
        topic, seq, payload = subscriber.recv_multipart()
    finally:
        subscriber.close(linger=0)
    assert topic == b"kv" and len(seq) == 8
    assert b"BlockStored" in payload  # msgpack: [ts, [{"type": "BlockStored", ...}], dp_rank]


def test_tiny_model_files_are_reproducible(tmp_path: Path, vllm_pair: VllmServers) -> None:
    started = time.monotonic()
    rebuilt = ensure_tiny_model(tmp_path / "model", MODEL)
    assert time.monotonic() - started < 10
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (rebuilt / name).read_bytes() == (vllm_pair.model_dir / name).read_bytes(), name
    assert train_tokenizer().to_str(pretty=True) == (rebuilt / "tokenizer.json").read_text()
    stamp = (rebuilt / "tokenizer.json").stat().st_mtime_ns
    ensure_tiny_model(rebuilt, MODEL)  # already built: nothing rewritten
    assert (rebuilt / "tokenizer.json").stat().st_mtime_ns == stamp


def test_a_killed_server_stops_answering_and_restarts(pair: VllmServers) -> None:
    url = pair.url("vllm-1")
    group = pair.pid("vllm-1")
    assert len(group_members(group)) >= 2  # the API server and the engine core it spawned
    try:
        pair.kill("vllm-1")
        assert not pair.is_running("vllm-1")
        assert group_members(group) == []
        with pytest.raises((urllib.error.URLError, OSError)):
            get(f"{url}/health", timeout=2)
        assert get(f"{pair.url('vllm-0')}/health")[0] == 200  # the other one is untouched
    finally:
        pair.restart("vllm-1")  # the pair stays whole for the module-scoped users
    assert get(f"{url}/health")[0] == 200


def test_a_server_that_exits_raises_with_its_log(tmp_path: Path, vllm_pair: VllmServers) -> None:
    spec = server_specs(1, prefix="broken")[0]
    servers = VllmServers([spec], vllm_pair.model_dir, tmp_path, extra_args=["--no-such-flag"])
    with pytest.raises(VllmStartError, match=r"(?s)broken-0 exited with code \d+.*no-such-flag"):
        servers.start()
    assert not servers.is_running("broken-0")
    assert launched_under(tmp_path) == []


def test_a_server_not_healthy_in_time_is_stopped(tmp_path: Path, vllm_pair: VllmServers) -> None:
    spec = server_specs(1, prefix="slow")[0]
    servers = VllmServers([spec], vllm_pair.model_dir, tmp_path, startup_timeout_s=3)
    with pytest.raises(VllmStartError, match="slow-0 did not answer /health within 3 s"):
        servers.start()
    assert servers.pid("slow-0") is None  # stopped and forgotten
    assert launched_under(tmp_path) == []  # nor did the engine core it spawned survive


def test_no_engine_environment_fails_clearly(tmp_path: Path) -> None:
    port, kv, replay = free_ports(3)
    spec = VllmServerSpec("vllm-x", port, kv, replay, core=0)
    with pytest.raises(VllmStartError, match="make engine"):
        VllmServers([spec], tmp_path, tmp_path, python=str(tmp_path / "no-python")).start()
