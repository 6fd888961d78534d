"""The emulated vLLM server read by TokenFleet's own vLLM side: its streams by ``openai_http``, its
``/metrics`` by the dispatcher's parser, its KV events by ``kv_wire`` and the dispatcher's
subscriber; its answers, errors, aborts and request-id counts; its command line. The server runs
in-process on loopback (the engine model in real time: short answers, a few hundred ms)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web

from agents.prompt_blocks import chained_block_hashes
from dispatcher.engines.vllm.kv_events import KvEventSubscriber
from dispatcher.engines.vllm.kv_wire import BlockRemoved, BlockStored, KvCacheEvent, decode_kv_batch
from dispatcher.engines.vllm.metrics import EngineMetrics, heartbeat_fields, parse_metrics
from dispatcher.engines.vllm.router_blocks import RouterBlocks
from infra.prompts import Prompts, PromptTokenizer
from infra.vllm.openai_http import EngineHttpError, Generation, engine_call, stream_generation
from local.emulated_vllm import answers
from local.emulated_vllm.__main__ import main
from local.emulated_vllm.engine import EmulatedEngine
from local.emulated_vllm.kv_events import KvPublisher, PromptBlocks, encode_batch, vllm_hash
from local.emulated_vllm.metrics import render
from local.emulated_vllm.server import EmulatedServer
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import free_ports
from schemas.events import ChatMessage, Heartbeat, InferenceRequest, KvEvent, Sampling
from sim.engine.profiles import get_profile

MODEL = "tiny"
PREAMBLE = "A long shared preamble that several calls start with. " * 120  # > 1 024 tokens


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model", MODEL)


@pytest.fixture(scope="module")
def prompts(tokenizer_dir: Path) -> Prompts:
    """How the gateway counts prompts (the inventory's tokenizer)."""
    return Prompts.from_dirs({MODEL: tokenizer_dir})


@contextlib.asynccontextmanager
async def serving(
    tokenizer_dir: Path, kv_events: str | None = None, speed: float = 1.0
) -> AsyncIterator[tuple[EmulatedServer, str]]:
    """The server on a free loopback port, its engine driven; yields it and its URL."""
    engine = EmulatedEngine(get_profile("llama3-8b-h100"), MODEL, speed)
    kv = None
    if kv_events is not None:
        replay = kv_events.rsplit(":", 1)[0] + f":{free_ports(1)[0]}"
        kv = KvPublisher(kv_events, replay, PromptBlocks(engine.resident))
    server = EmulatedServer(engine, PromptTokenizer.from_dir(tokenizer_dir), MODEL, kv)
    runner = web.AppRunner(server.app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    driver = asyncio.create_task(engine.run())
    try:
        yield server, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
        await runner.cleanup()
        if kv is not None:
            kv.close()


def collect(into: list[dict[str, Any]]) -> Callable[[dict[str, Any], bytes], Awaitable[None]]:
    """An ``on_event`` for ``stream_generation`` that keeps every event."""

    async def seen(event: dict[str, Any], _raw: bytes) -> None:
        into.append(event)

    return seen


def request(**fields: Any) -> InferenceRequest:
    base: dict[str, Any] = {"request_id": "r", "model": MODEL, "output_budget": 12}
    return InferenceRequest(**{**base, **fields})


# -- streams, answers, errors ---------------------------------------------------------------------


def test_streams_read_by_the_gateways_client_count_as_the_gateway_does(
    tokenizer_dir: Path, prompts: Prompts
) -> None:
    chat = request(messages=(ChatMessage(role="user", content="Say something about Kafka."),))
    chat = chat.model_copy(update={"sampling": Sampling(ignore_eos=True)})
    completion = request(prompt=PREAMBLE, output_budget=5, sampling=Sampling(ignore_eos=True))

    async def run() -> list[tuple[Generation, list[dict[str, Any]]]]:
        found = []
        async with serving(tokenizer_dir) as (_server, url), aiohttp.ClientSession() as session:
            for call in (chat, completion):
                events: list[dict[str, Any]] = []
                path, body = engine_call(call, MODEL)
                found.append((await stream_generation(session, url, path, body, collect(events)), events))
        return found

    (chat_answer, chat_events), (text_answer, text_events) = asyncio.run(run())
    for call, answer, events in ((chat, chat_answer, chat_events), (completion, text_answer, text_events)):
        assert answer.prompt_tokens == prompts.complete(call).input_tokens  # the gateway's count
        assert answer.completion_tokens == call.output_budget and answer.finish_reason == "length"
        assert answer.text == answers.token_text(0, call.output_budget)
        assert answer.first_token_ts is not None and answer.last_token_ts is not None
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == call.output_budget
        assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"
    assert chat_events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {e["object"] for e in chat_events} == {"chat.completion.chunk"}
    assert {e["object"] for e in text_events} == {"text_completion"}


def test_whole_answers_errors_and_the_served_request_ids(tokenizer_dir: Path) -> None:
    body = {"model": MODEL, "prompt": "Tell me about prefix caches.", "max_tokens": 600}

    async def run() -> dict[str, Any]:
        found: dict[str, Any] = {}
        async with serving(tokenizer_dir, speed=20) as (server, url), aiohttp.ClientSession() as session:

            async def post(path: str, payload: Any, **headers: str) -> tuple[int, Any]:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                async with session.post(url + path, data=data, headers=headers) as response:
                    return response.status, await response.json()

            found["natural"] = await post("/v1/completions", body, **{"x-request-id": "call-1"})
            found["again"] = await post("/v1/completions", body, **{"x-request-id": "call-1"})
            found["chat"] = await post(
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                 "ignore_eos": True, "request_id": "in-body"},
            )  # fmt: skip
            found["unknown model"] = await post("/v1/completions", {**body, "model": "other"})
            found["not json"] = await post("/v1/completions", b"{not json")
            found["too long"] = await post(
                "/v1/completions", {**body, "max_tokens": server.engine.max_model_len}
            )
            async with session.get(url + "/debug/served") as served:
                found["served"] = await served.json()
            async with session.get(url + "/v1/models") as models:
                found["models"] = await models.json()
        return found

    found = asyncio.run(run())
    status, natural = found["natural"]
    ids = PromptTokenizer.from_dir(tokenizer_dir).token_ids(request(prompt=body["prompt"]))
    length, reason = answers.answer_length(ids, 600, ignore_eos=False)
    assert status == 200 and natural["id"] == "cmpl-call-1" and natural["object"] == "text_completion"
    assert natural["usage"]["completion_tokens"] == length
    assert natural["choices"][0]["finish_reason"] == reason
    assert found["again"][1]["usage"] == natural["usage"]  # the same prompt, the same answer
    status, chat = found["chat"]
    assert status == 200 and chat["id"] == "chatcmpl-in-body" and chat["usage"]["completion_tokens"] == 3
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert found["unknown model"][0] == 404 and found["unknown model"][1]["error"]["param"] == "model"
    assert found["not json"][0] == 400 and "not valid JSON" in found["not json"][1]["error"]["message"]
    status, refused = found["too long"]
    assert status == 400 and "maximum context length" in refused["error"]["message"]
    assert found["served"] == {"requests": {"call-1": 2, "in-body": 1}}  # refused calls are not started
    assert [m["id"] for m in found["models"]["data"]] == [MODEL]


def test_the_answers_length_is_the_budget_or_the_prompts_own_rule() -> None:
    assert answers.answer_length([5, 6, 7], 40, ignore_eos=True) == (40, "length")
    natural, reason = answers.answer_length([5, 6, 7], answers.NATURAL_MAX_TOKENS, ignore_eos=False)
    assert 1 <= natural <= answers.NATURAL_MAX_TOKENS and reason == "stop"
    assert answers.answer_length([5, 6, 7], natural - 1, ignore_eos=False) == (natural - 1, "length")
    assert answers.answer_length([5, 6, 7], 10_000, ignore_eos=False) == (natural, "stop")


def test_a_client_that_hangs_up_aborts_its_call_and_metrics_say_so(tokenizer_dir: Path) -> None:
    call = request(prompt="a long answer", output_budget=100_000, sampling=Sampling(ignore_eos=True))

    async def run() -> tuple[EngineMetrics, EngineMetrics]:
        async with serving(tokenizer_dir) as (_server, url), aiohttp.ClientSession() as session:
            first = asyncio.Event()

            async def seen(_event: dict[str, Any], _raw: bytes) -> None:
                first.set()

            path, body = engine_call(call, MODEL)
            streaming = asyncio.create_task(stream_generation(session, url, path, body, seen))
            await asyncio.wait_for(first.wait(), 10)
            async with session.get(url + "/metrics") as scrape:
                during = parse_metrics(await scrape.text(), MODEL)
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming
            for _ in range(100):
                async with session.get(url + "/metrics") as scrape:
                    after = parse_metrics(await scrape.text(), MODEL)
                if after.running == 0:
                    break
                await asyncio.sleep(0.02)
            return during, after

    during, after = asyncio.run(run())
    assert (during.running, during.waiting) == (1, 0) and during.kv_usage > 0
    assert (after.running, after.waiting, after.kv_usage) == (0, 0, 0.0)


# -- /metrics -------------------------------------------------------------------------------------


def test_the_metrics_read_back_into_the_heartbeat_they_came_from() -> None:
    beat = Heartbeat(
        instance_id="emulated", dc="local", model=MODEL, model_version="1", waiting=3, running=7,
        tokens_in_flight=9000, kv_blocks_used=205, kv_blocks_total=820, prefix_cache_queries=12_100,
        prefix_cache_hits=4096, preemptions=2, kv_block_tokens=512,
    )  # fmt: skip
    metrics = parse_metrics(render(beat, MODEL).decode(), MODEL)
    assert (metrics.running, metrics.waiting, metrics.preemptions) == (7, 3, 2)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (512, 820)
    fields = heartbeat_fields(metrics, None, None, beat.tokens_in_flight)
    assert fields == {name: getattr(beat, name) for name in fields}


# -- KV events ------------------------------------------------------------------------------------


def test_cache_changes_decode_onto_the_prompts_own_block_hashes() -> None:
    shared = list(range(1, 1025))  # two full blocks
    first, second = [*shared, *range(5000, 5512)], [*shared, *range(7000, 7600)]
    first_hashes, second_hashes = chained_block_hashes(first), chained_block_hashes(second)
    blocks = PromptBlocks(cached=lambda _block: False)
    blocks.hold(first_hashes, first)
    blocks.hold(second_hashes, second)
    mapping = RouterBlocks()

    def published(kind: Literal["stored", "removed"], hashes: tuple[int, ...]) -> list[KvCacheEvent]:
        change = KvEvent(instance_id="emulated", model=MODEL, kind=kind, block_hashes=hashes)
        batch = decode_kv_batch(encode_batch(1.0, [change], blocks))
        mapping.apply(batch)
        return list(batch.events)

    assert [type(e) for e in published("stored", first_hashes[:2])] == [BlockStored]
    (rest,) = published("stored", first_hashes[2:])
    assert isinstance(rest, BlockStored) and rest.parent_block_hash == vllm_hash(first_hashes[1])
    assert rest.block_size == 512 and list(rest.token_ids) == first[1024:]
    assert mapping.held == set(first_hashes)
    (own,) = published("stored", second_hashes[2:])  # after the shared prefix, its own block
    assert isinstance(own, BlockStored) and own.parent_block_hash == vllm_hash(second_hashes[1])
    assert mapping.held == set(first_hashes) | set(second_hashes)
    blocks.let_go(second_hashes)
    assert published("removed", second_hashes[2:]) == [BlockRemoved((vllm_hash(second_hashes[2]),), "GPU", 0)]
    assert mapping.held == set(first_hashes)
    assert blocks.get(second_hashes[2]) is None  # neither held by a call nor cached: forgotten
    # Blocks that do not continue one another are told apart, each after its own parent.
    apart = KvEvent(instance_id="emulated", model=MODEL, kind="stored", block_hashes=first_hashes[::2])
    runs = decode_kv_batch(encode_batch(1.0, [apart], blocks)).events
    assert [e.parent_block_hash for e in runs if isinstance(e, BlockStored)] == [
        None,
        vllm_hash(first_hashes[1]),
    ]


def test_the_dispatchers_subscriber_sees_what_a_call_cached(tokenizer_dir: Path, prompts: Prompts) -> None:
    call = request(prompt=PREAMBLE, output_budget=2)
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"

    async def run() -> list[KvEvent]:
        async with serving(tokenizer_dir, endpoint) as (_server, url), aiohttp.ClientSession() as session:
            subscriber = KvEventSubscriber("emulated", MODEL, endpoint)
            try:
                await subscriber.poll()  # connects
                await asyncio.sleep(0.3)  # ZMQ's slow joiner: subscribed before anything is sent
                await stream_generation(session, url, *engine_call(call, MODEL))
                seen: list[KvEvent] = []
                for _ in range(100):
                    seen += await subscriber.poll()
                    if seen:
                        break
                    await asyncio.sleep(0.02)
                assert subscriber.stats.resyncs == 0 and subscriber.stats.skipped_blocks == 0
                return seen
            finally:
                subscriber.close()

    (stored,) = asyncio.run(run())
    assert stored.kind == "stored" and stored.block_hashes == prompts.complete(call).prompt_block_hashes


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --port"),
        (["--port", "8001", "--profile", "nope"], "unknown engine profile 'nope'"),
        (["--port", "8001", "--speed", "0"], "--speed: 0 is not a finite number in [0.001, 1e6]"),
        (["--port", "8001", "--kv-events", "localhost:5557"], "is not a ZMQ endpoint"),
        (["--port", "8001", "--kv-replay", "tcp://127.0.0.1:5558"], "--kv-replay needs --kv-events"),
        (["--port", "8001", "--tokenizer", "/no/such/dir"], "--tokenizer: cannot load"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert err.startswith("python -m local.emulated_vllm: error: ")


def test_a_refused_call_is_reported_to_the_gateways_client(tokenizer_dir: Path) -> None:
    async def run() -> EngineHttpError:
        async with serving(tokenizer_dir) as (server, url), aiohttp.ClientSession() as session:
            too_long = request(prompt="x", output_budget=server.engine.max_model_len)
            with pytest.raises(EngineHttpError) as refused:
                await stream_generation(session, url, *engine_call(too_long, MODEL))
            return refused.value

    refused = asyncio.run(run())
    assert refused.status == 400 and "maximum context length" in str(refused)
