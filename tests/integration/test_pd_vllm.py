"""Prefill on one real vLLM CPU server, decode on another (``infra.vllm.prefill_decode``),
and the vLLM engine port (``VllmEngines``) running a decision that names a prefill instance.

Two servers of the tiny model, each on its own core: ``pd-0`` the prefill server (role
``prefill``: ``kv_producer``), ``pd-1`` the decode server (role ``decode``: ``kv_consumer``),
both with vLLM's example connector (``ExampleConnector``: the prefill server writes each new
prompt's KV cache to a shared directory, one file per layer under a hash of the prompt's tokens;
a server finds it there by the prompt). The calls are built by the vLLM adapter's ``engine_call``.

The model has real random weights (``write_random_weights``), not vLLM's dummy ones: dummy
weights are so small that the answer hardly depends on the KV cache (a tampered cache gives the
same tokens), so an equal answer would prove nothing. With these weights a swapped cache changes
the answer (``test_the_decode_continues_from_the_transferred_cache``).

"Aggregated serving" is the same call run whole on the decode server from scratch: the shared
directory emptied (the connector would load the prompt from it) and a ``cache_salt`` its prefix
cache has never seen; its usage shows no cached token.

The last test stops the prefill server, so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest
from tokenizers import Tokenizer

from dispatcher.engines.port import EngineEvent
from dispatcher.engines.vllm.adapter import VllmEngines
from infra.vllm.openai_http import Generation, engine_call, stream_generation
from infra.vllm.prefill_decode import PrefillDecode, decode, prefill, prefill_then_decode
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import (
    ENGINE_MISSING,
    VllmServers,
    engine_python_or_none,
    free_ports,
    kv_bytes_per_token,
    server_specs,
)
from schemas.events import (
    ChatMessage,
    Completion,
    InferenceRequest,
    Response,
    ResponseStarted,
    RoutingDecision,
    Sampling,
)

MODEL = "tiny-llama"
BLOCK = 32  # VllmServers' block size
OUTPUT_TOKENS = 24
LABELS = f'{{engine="0",model_name="{MODEL}"}}'
PROMPT_TOKENS = f"vllm:prompt_tokens_total{LABELS}"
TRANSFERRED = (
    f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{MODEL}",source="external_kv_transfer"}}'
)
CODE = "def route(request, instances):\n    return min(instances, key=lambda i: i.load)\n"
T = TypeVar("T")


# -- the servers -------------------------------------------------------------------------------


def write_random_weights(model_dir: Path, std: float = 0.05, seed: int = 0) -> None:
    """``model.safetensors`` for the Llama config of ``model_dir``: every matrix drawn from
    N(0, ``std``), norms at 1, float32, the same bytes for the same config and seed."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    head = config["head_dim"]
    q, kv, mlp = (
        config["num_attention_heads"] * head,
        config["num_key_value_heads"] * head,
        config["intermediate_size"],
    )
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray[Any, Any]:
        return rng.normal(0.0, std, (rows, cols)).astype("<f4")

    ones = np.ones(hidden, "<f4")
    tensors = {"model.embed_tokens.weight": matrix(vocab, hidden), "model.norm.weight": ones}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        tensors |= {
            layer + "self_attn.q_proj.weight": matrix(q, hidden),
            layer + "self_attn.k_proj.weight": matrix(kv, hidden),
            layer + "self_attn.v_proj.weight": matrix(kv, hidden),
            layer + "self_attn.o_proj.weight": matrix(hidden, q),
            layer + "mlp.gate_proj.weight": matrix(mlp, hidden),
            layer + "mlp.up_proj.weight": matrix(mlp, hidden),
            layer + "mlp.down_proj.weight": matrix(hidden, mlp),
            layer + "input_layernorm.weight": ones,
            layer + "post_attention_layernorm.weight": ones,
        }
    tensors["lm_head.weight"] = matrix(vocab, hidden)
    # The safetensors format: an 8-byte little-endian header length, a JSON header padded to 8
    # bytes naming each tensor's dtype, shape and byte range, then the raw data.
    header: dict[str, Any] = {}
    offset = 0
    for name, array in tensors.items():
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with (model_dir / "model.safetensors").open("wb") as out:
        out.write(len(encoded).to_bytes(8, "little") + encoded)
        for array in tensors.values():
            out.write(array.tobytes())


@dataclass
class Pair:
    servers: VllmServers  # pd-0 prefills, pd-1 decodes
    storage: Path
    tokenizer: Tokenizer

    @property
    def prefill_url(self) -> str:
        return self.servers.url("pd-0")

    @property
    def decode_url(self) -> str:
        return self.servers.url("pd-1")

    def wipe_storage(self) -> None:
        for entry in self.storage.iterdir():
            shutil.rmtree(entry)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    python = engine_python_or_none()
    if python is None:
        pytest.fail(ENGINE_MISSING, pytrace=False)
    root = tmp_path_factory.mktemp("pd_vllm")
    model = ensure_tiny_model(root / "model", MODEL)
    write_random_weights(model)
    storage = root / "kv"
    storage.mkdir()
    first, second = server_specs(2, prefix="pd")  # pd-0 on the first core, pd-1 on the second
    servers = VllmServers(
        [replace(first, role="prefill"), replace(second, role="decode")],
        model,
        root / "servers",
        served_model_name=MODEL,
        python=python,
        load_format="safetensors",
        kv_connector={
            "kv_connector": "ExampleConnector",
            "kv_connector_extra_config": {"shared_storage_path": str(storage)},
        },
    )
    with servers:
        yield Pair(servers, storage, Tokenizer.from_file(str(model / "tokenizer.json")))


# -- calls ---------------------------------------------------------------------------------------


def greedy(prompt: str | None = None, messages: tuple[ChatMessage, ...] | None = None) -> InferenceRequest:
    """A greedy request of ``OUTPUT_TOKENS`` tokens."""
    return InferenceRequest(
        request_id=f"pd-{uuid.uuid4().hex[:8]}",
        model=MODEL,
        prompt=prompt,
        messages=messages,
        output_budget=OUTPUT_TOKENS,
        sampling=Sampling(temperature=0, ignore_eos=True),
    )


def call(
    prompt: str | None = None, messages: tuple[ChatMessage, ...] | None = None
) -> tuple[str, dict[str, Any]]:
    """The adapter's engine call for ``greedy(prompt, messages)``."""
    return engine_call(greedy(prompt, messages), MODEL)


def run(work: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def session_run() -> T:
        async with aiohttp.ClientSession() as session:
            return await work(session)

    return asyncio.run(session_run())


def run_pd(
    pair: Pair, path: str, body: dict[str, Any], prefill_url: str | None = None, **options: Any
) -> PrefillDecode:
    return run(
        lambda s: prefill_then_decode(
            s, prefill_url or pair.prefill_url, pair.decode_url, path, body, **options
        )
    )


def aggregated(pair: Pair, path: str, body: dict[str, Any]) -> Generation:
    """The call run whole on the decode server from scratch (module docstring)."""
    pair.wipe_storage()
    salted = dict(body, cache_salt=f"aggregated-{uuid.uuid4().hex}")
    generation = run(lambda s: stream_generation(s, pair.decode_url, path, salted, timeout_s=60))
    pair.wipe_storage()  # the connector stored what the decode server computed: not a prefill's
    assert generation.cached_tokens == 0, "the aggregated reference reused a cache"
    return generation


def metric(url: str, line_start: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


def moved_tokens(prompt_tokens: int) -> int:
    """Prompt tokens the example connector hands over: the whole blocks of the prompt without
    its last token (that one the decode server computes, to sample the first output token). Its
    key for writing (the whole blocks of the prompt) and for reading (of the prompt without its
    last token) differ when the prompt is one token past a block boundary: the prompts here
    avoid that length."""
    assert prompt_tokens % BLOCK != 1, f"{prompt_tokens} tokens: the example connector misses its own cache"
    return (prompt_tokens - 2) // BLOCK * BLOCK


def same_answer(got: Generation, reference: Generation) -> None:
    assert (got.text, got.completion_tokens, got.finish_reason) == (
        reference.text,
        reference.completion_tokens,
        reference.finish_reason,
    )
    assert got.completion_tokens == OUTPUT_TOKENS and got.prompt_tokens == reference.prompt_tokens


# -- the tests -----------------------------------------------------------------------------------

CASES = {
    "short": call(prompt="The scheduler routes each request."),
    "several-blocks": call(prompt="# the router\n" + CODE * 8 + "# and again"),
    "chat": call(
        messages=(
            ChatMessage(role="system", content="You answer questions about schedulers. " + CODE * 4),
            ChatMessage(role="user", content="Which instance does route pick?"),
        )
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_then_decode_answers_as_aggregated_serving(pair: Pair, case: str) -> None:
    path, body = CASES[case]
    transferred_before = metric(pair.decode_url, TRANSFERRED)
    result = run_pd(pair, path, body, timeout_s=120)
    assert (result.disaggregated, result.fallback, result.kv_transfer_params) == (True, "", None)
    got = result.generation
    # The decode server loaded the prompt from what the prefill server wrote: nothing else had it.
    moved = moved_tokens(got.prompt_tokens)
    assert got.cached_tokens == moved
    assert metric(pair.decode_url, TRANSFERRED) - transferred_before == moved
    if case != "short":
        assert moved >= 4 * BLOCK
    same_answer(got, aggregated(pair, path, body))


def test_the_decode_continues_from_the_transferred_cache(pair: Pair) -> None:
    """The prefill server's caches of two prompts of one length swapped in the shared directory:
    the decode of the first, given the second's cache, answers differently."""
    first = "# router one\n" + CODE * 6
    second = "# router two\n" + CODE * 6
    assert len(pair.tokenizer.encode(first).ids) == len(pair.tokenizer.encode(second).ids)
    path, body = call(prompt=first)
    reference = aggregated(pair, path, body)  # leaves the directory empty

    async def swapped(session: aiohttp.ClientSession) -> Generation:
        params = await prefill(session, pair.prefill_url, path, body, timeout_s=60)
        (first_dir,) = list(pair.storage.iterdir())
        await prefill(session, pair.prefill_url, *call(prompt=second), timeout_s=60)
        (second_dir,) = [d for d in pair.storage.iterdir() if d != first_dir]
        first_dir.rename(pair.storage / "swap")
        second_dir.rename(first_dir)
        (pair.storage / "swap").rename(second_dir)
        return await decode(session, pair.decode_url, path, body, params, timeout_s=60)

    got = run(swapped)
    assert got.cached_tokens == moved_tokens(got.prompt_tokens) >= 4 * BLOCK
    assert got.completion_tokens == OUTPUT_TOKENS
    assert got.text != reference.text
    pair.wipe_storage()


# -- through the engine port ---------------------------------------------------------------------


def decision(request: InferenceRequest, prefill_instance_id: str) -> RoutingDecision:
    """``request`` decoded on ``pd-1`` after ``prefill_instance_id`` prefilled it."""
    return RoutingDecision(
        request_id=request.request_id,
        model=MODEL,
        slo_class="interactive",
        dc="local",
        instance_id="pd-1",
        prefill_instance_id=prefill_instance_id,
        policy="tokenpilot",
        decision_latency_s=0.0,
        request=request,
    )


def through_engines(
    pair: Pair, routing: RoutingDecision, prefill_legs: int
) -> tuple[ResponseStarted, Response, Completion]:
    """Dispatch ``routing`` to a ``VllmEngines`` over the pair and return the attempt's events,
    checked to be ``prefill_legs`` ends of a prefill leg on ``pd-0`` (``prefill_leg``), then a
    whole call's on ``pd-1``: one first token, one response, one completion."""

    async def dispatched() -> list[EngineEvent]:
        engines = VllmEngines(pair.servers.inventory(), kv_events=False)
        try:
            assert await engines.dispatch(routing, time.time())
            deadline = time.monotonic() + 120
            while engines.open_requests and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return await engines.events(time.time())
        finally:
            await engines.close()

    events = asyncio.run(dispatched())
    legs = [e for e in events if isinstance(e, ResponseStarted) and e.prefill_leg]
    assert [(e.instance_id, e.request_id) for e in legs] == [("pd-0", routing.request_id)] * prefill_legs
    events = events[prefill_legs:]  # (a prefill leg ends before the call's first token)
    assert [type(e) for e in events] == [ResponseStarted, Response, Completion]
    started, response, completion = events
    assert isinstance(started, ResponseStarted) and isinstance(response, Response)
    assert isinstance(completion, Completion)
    assert {e.instance_id for e in (started, response, completion)} == {"pd-1"}
    assert response.status == completion.status == "ok", response.error
    assert completion.output_tokens == response.completion_tokens == OUTPUT_TOKENS
    assert completion.cached_tokens == response.cached_tokens
    return started, response, completion


def same_text(response: Response, reference: Generation) -> None:
    assert (response.text, response.finish_reason, response.prompt_tokens) == (
        reference.text,
        reference.finish_reason,
        reference.prompt_tokens,
    )


def test_the_engine_ports_heartbeats_say_each_servers_role(pair: Pair) -> None:
    async def scraped() -> dict[str, tuple[str, int, bool]]:
        engines = VllmEngines(pair.servers.inventory(), scrape_s=0.2, kv_events=False)
        try:
            await engines.load(time.time())  # starts the scrapers
            deadline = time.monotonic() + 10
            while not all(engines.readiness().values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            beats = await engines.load(time.time())
        finally:
            await engines.close()
        return {b.instance_id: (b.role, b.kv_bytes_per_token, b.endpoint_ready) for b in beats}

    kv_bytes = kv_bytes_per_token(pair.servers.model_dir)
    assert kv_bytes > 0
    assert asyncio.run(scraped()) == {"pd-0": ("prefill", kv_bytes, True), "pd-1": ("decode", kv_bytes, True)}


def test_the_engine_port_prefills_on_the_decisions_prefill_instance(pair: Pair) -> None:
    request = greedy(prompt="# through the engine port\n" + CODE * 8)
    transferred_before = metric(pair.decode_url, TRANSFERRED)
    prefill_prompts = metric(pair.prefill_url, PROMPT_TOKENS)
    _, response, _ = through_engines(pair, decision(request, "pd-0"), prefill_legs=1)
    moved = moved_tokens(response.prompt_tokens)
    assert moved >= 4 * BLOCK and response.cached_tokens == moved
    assert metric(pair.decode_url, TRANSFERRED) - transferred_before == moved
    assert metric(pair.prefill_url, PROMPT_TOKENS) - prefill_prompts == response.prompt_tokens
    same_text(response, aggregated(pair, *engine_call(request, MODEL)))


def test_the_engine_port_runs_a_decision_with_an_unknown_prefill_instance_whole(pair: Pair) -> None:
    request = greedy(prompt="# no such prefill instance\n" + CODE * 5)
    transferred_before = metric(pair.decode_url, TRANSFERRED)
    prefill_prompts = metric(pair.prefill_url, PROMPT_TOKENS)
    _, response, _ = through_engines(pair, decision(request, "pd-9"), prefill_legs=0)
    assert response.cached_tokens == 0
    assert metric(pair.decode_url, TRANSFERRED) == transferred_before
    assert metric(pair.prefill_url, PROMPT_TOKENS) == prefill_prompts
    same_text(response, aggregated(pair, *engine_call(request, MODEL)))


# How the prefill step is made to fail -> the fallback's reason starts with.
FALLBACKS = {"busy": "busy", "refused": "refused: ", "unreachable": "failed: ", "timeout": "timeout"}


@pytest.mark.parametrize("how", list(FALLBACKS))
def test_a_prefill_that_cannot_be_had_falls_back_to_local_prefill(pair: Pair, how: str) -> None:
    path, body = call(prompt=f"# fallback when {how}\n" + CODE * 5)
    prefill_url = pair.prefill_url
    options: dict[str, Any] = {}
    if how == "busy":
        options["prefill_busy"] = True
    elif how == "refused":
        prefill_url += "/no-such-api"  # the prefill server answers 404
    elif how == "unreachable":
        prefill_url = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    else:
        options["prefill_timeout_s"] = 1e-4
    prefill_prompts = metric(pair.prefill_url, PROMPT_TOKENS)
    transferred_before = metric(pair.decode_url, TRANSFERRED)
    result = run_pd(pair, path, body, prefill_url, timeout_s=120, **options)
    assert not result.disaggregated and result.kv_transfer_params is None
    assert result.fallback.startswith(FALLBACKS[how]), result.fallback
    if how != "timeout":  # a call timed out may have reached the prefill server before it gave up
        assert metric(pair.prefill_url, PROMPT_TOKENS) == prefill_prompts
        assert result.generation.cached_tokens == 0
        assert metric(pair.decode_url, TRANSFERRED) == transferred_before
    same_answer(result.generation, aggregated(pair, path, body))


def test_a_stopped_prefill_server_falls_back_to_local_prefill(pair: Pair) -> None:
    """Also through the engine port: a decision naming the stopped server as its prefill
    instance is answered by the decode server alone."""
    path, body = call(prompt="# the prefill server is gone\n" + CODE * 5)
    pair.servers.kill("pd-0")
    result = run_pd(pair, path, body, timeout_s=120)
    assert not result.disaggregated and result.fallback.startswith("failed: "), result.fallback
    assert result.generation.cached_tokens == 0
    same_answer(result.generation, aggregated(pair, path, body))

    request = greedy(prompt="# the prefill server is still gone\n" + CODE * 5)
    transferred_before = metric(pair.decode_url, TRANSFERRED)
    _, response, _ = through_engines(pair, decision(request, "pd-0"), prefill_legs=0)
    assert response.cached_tokens == 0 and metric(pair.decode_url, TRANSFERRED) == transferred_before
    same_text(response, aggregated(pair, *engine_call(request, MODEL)))
