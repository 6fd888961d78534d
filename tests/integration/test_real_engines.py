"""TokenFleet in front of two real vLLM servers (CPU, tiny model, random weights): no engine mock.

One stack for the module (``EngineStack``: a worker routing with TokenPilot, the dispatcher over
the two servers, the gateway) on the session's broker. The official ``openai`` client talks to
the gateway; the engines' own ``/metrics`` and KV events show what happened there. The last test
kills a server, so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from openai import OpenAI

from dispatcher.engines.vllm.metrics import parse_metrics
from infra.kafka.batches import collect_results
from infra.kafka.connection import KafkaConnection
from infra.vllm.inventory import dump_inventory
from lab.engine_stack import EngineStack, StackOptions
from local.vllm_launcher import VllmServers
from schemas.codec import decode
from schemas.events import Completion, Heartbeat, InferenceRequest, Response, RoutingDecision, Sampling
from schemas.topics import COMPLETIONS, DECISIONS, HEARTBEATS, REQUESTS, RESPONSES
from tests.integration.streaming import Collector, publish, unique
from traffic.loadgen import submit_batch

MODEL = "tiny-llama"
T = TypeVar("T")


class LoopThread:
    """An event loop in a thread: the stack runs there, the sync ``openai`` client here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def stack(
    broker: str,
    vllm_pair: VllmServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EngineStack, LoopThread]]:
    data = Path(tmp_path_factory.mktemp("engines"))
    inventory = data / "inventory.yaml"
    inventory.write_text(dump_inventory(vllm_pair.inventory()))
    runner = LoopThread()
    engine_stack = EngineStack(broker, inventory, data, StackOptions(app_id=unique("engines")))
    runner.run(engine_stack.__aenter__())
    try:
        yield engine_stack, runner
    finally:
        runner.run(engine_stack.close())
        runner.close()


@pytest.fixture(scope="module")
def client(stack: tuple[EngineStack, LoopThread]) -> OpenAI:
    return OpenAI(base_url=stack[0].gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def scrape(url: str) -> Any:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        return parse_metrics(answer.read().decode(), MODEL)


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def decisions_for(stack: EngineStack, runner: LoopThread, prefix: str, count: int) -> list[RoutingDecision]:
    """The routing decisions of request ids starting with ``prefix`` (read from tf.decisions)."""

    async def read() -> list[RoutingDecision]:
        async with Collector(stack.bootstrap, DECISIONS, MODEL.encode()) as collector:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                found = [decode(RoutingDecision, v) for v in collector.values if prefix.encode() in v]
                if len(found) >= count:
                    return found
                await asyncio.sleep(0.2)
        return found

    return runner.run(read())


def test_chat_and_completions_through_the_gateway_streamed_and_not(client: OpenAI) -> None:
    request_id = unique("chat")
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": request_id},
    )
    assert chat.id == f"chatcmpl-{request_id}" and chat._request_id == request_id
    assert chat.choices[0].message.role == "assistant" and chat.usage is not None
    assert chat.usage.completion_tokens == 8 and chat.usage.prompt_tokens > 0
    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 6

    # Streamed: several chunks, and the usage chunk counts every token. Not one chunk per token:
    # vLLM's detokenizer holds a token back until its text is complete and may send two at once.
    pieces, usage = [], []
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        elif chunk.usage is not None:
            usage.append(chunk.usage.completion_tokens)
    assert usage == [12] and len([p for p in pieces if p]) >= 3
    texts, usage = [], []
    for piece in client.completions.create(
        model=MODEL,
        prompt="Stream",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if piece.choices:
            texts.append(piece.choices[0].text)
        elif piece.usage is not None:
            usage.append(piece.usage.completion_tokens)
    assert usage == [5] and len([t for t in texts if t]) >= 2
    assert {m.id for m in client.models.list().data} == {MODEL}


def test_unknown_model_and_bad_bodies_get_openai_errors(client: OpenAI) -> None:
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="", max_tokens=4)
    # Beyond the engine's context (4 096 tokens): the engine's own 400, passed on, not retried.
    with pytest.raises(openai.BadRequestError, match="engine refused"):
        client.completions.create(model=MODEL, prompt=list(range(1, 4200)), max_tokens=4)


def test_requests_sharing_a_long_prefix_land_where_it_is_cached(
    stack: tuple[EngineStack, LoopThread],
    client: OpenAI,
    vllm_pair: VllmServers,
) -> None:
    engine_stack, runner = stack
    # ~1 600 tokens of shared system prompt: three full 512-token prefix blocks.
    system = " ".join(f"rule {i}: answer in the voice of a careful librarian." for i in range(160))
    tag = unique("prefix")
    urls = {i.instance_id: i.url for i in engine_stack.inventory.instances}
    hits_before = {name: scrape(url).prefix_cache_hits for name, url in urls.items()}
    for i in range(6):
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": f"{tag} question {i}"},
            ],
            max_tokens=4,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": f"{tag}-{i}"},
        )
        # A user's next turn comes after the answer: by then the router has heard, through the
        # bus, of the first token and the end (~0.1 s). Without the pause, the next request can
        # race the first-token event and see the previous prefill still queued there.
        time.sleep(0.5)
    decided = [d for d in decisions_for(engine_stack, runner, tag, 6) if d.request_id.startswith(tag)]
    assert len(decided) == 6
    home = decided[0].instance_id
    assert [d.instance_id for d in decided] == [home] * 6, [
        (
            d.instance_id,
            len(d.request.prompt_block_hashes),
            d.request.input_tokens,
            d.predicted_ttft_s,
            d.reason,
        )
        for d in decided
    ]
    # The engine that served them found the prefix in its cache; the other saw none of it.
    hits = {name: scrape(url).prefix_cache_hits - hits_before[name] for name, url in urls.items()}
    other = next(name for name in urls if name != home)
    blocks = len(decided[0].request.prompt_block_hashes)  # the gateway hashed the chat as vLLM sees it
    assert blocks >= 3
    assert hits[home] >= 5 * 512 * blocks, hits
    assert hits[other] == 0, hits
    # ...and the KV events of that engine told the router it holds those blocks.
    assert engine_stack.engines.kv_stats()[home]["stored_blocks"] >= blocks

    async def completions() -> list[Completion]:
        async with Collector(engine_stack.bootstrap, COMPLETIONS, MODEL.encode()) as collector:
            await asyncio.sleep(3)
            return [decode(Completion, v) for v in collector.values if tag.encode() in v]

    cached = sorted(c.cached_tokens for c in runner.run(completions()) if c.request_id.startswith(tag))
    assert len(cached) == 6 and cached[0] < 512 and cached[1] >= 512 * blocks, cached  # as vLLM reported


def test_a_client_disconnect_aborts_the_generation_at_the_engine(
    stack: tuple[EngineStack, LoopThread], client: OpenAI
) -> None:
    engine_stack, runner = stack
    tag = unique("hangup")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"{tag} tell me everything"}],
        max_tokens=3000,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": tag},  # the call's id on the bus
    )
    started = time.time()
    for _ in zip(range(5), stream, strict=False):
        pass
    (decision,) = [d for d in decisions_for(engine_stack, runner, tag, 1) if d.request_id == tag]
    url = engine_stack.inventory.instance(decision.instance_id).url  # type: ignore[union-attr]
    assert scrape(url).running >= 1

    async def tokens_in_flight(since: float) -> list[int]:
        """The instance's heartbeats since ``since``: the dispatcher counts the gateway's call too."""
        async with Collector(engine_stack.bootstrap, HEARTBEATS, MODEL.encode()) as collector:
            await asyncio.sleep(2.0)
            beats = [decode(Heartbeat, v) for v in collector.values]
        return [b.tokens_in_flight for b in beats if b.instance_id == decision.instance_id and b.ts > since]

    running = runner.run(tokens_in_flight(started + 1.0))
    assert running and min(running) >= decision.request.input_tokens, running
    stream.close()  # the client hangs up
    wait_until(lambda: scrape(url).running == 0, 10, "the engine to abort the request")
    ended_at = time.time()

    async def aborted() -> list[Completion]:
        async with Collector(engine_stack.bootstrap, COMPLETIONS, MODEL.encode()) as collector:
            await asyncio.sleep(3)
            return [decode(Completion, v) for v in collector.values if decision.request_id.encode() in v]

    (ended,) = runner.run(aborted())
    assert ended.status == "aborted" and 5 <= ended.output_tokens < 3000
    assert runner.run(tokens_in_flight(ended_at + 1.0))[-1] == 0  # its end left the count


def test_a_kafka_published_request_gets_its_answer_on_tf_responses(
    stack: tuple[EngineStack, LoopThread],
) -> None:
    engine_stack, runner = stack
    request_id = unique("kafka")
    # A prompt without input_tokens or hashes: the worker counts and hashes it with the tokenizer.
    request = InferenceRequest(
        request_id=request_id,
        model=MODEL,
        prompt="The quick brown fox",
        output_budget=7,
        sampling=Sampling(ignore_eos=True, temperature=0),
    )

    async def roundtrip() -> list[Response]:
        async with Collector(engine_stack.bootstrap, RESPONSES, request_id.encode()) as collector:
            await publish(engine_stack.bootstrap, REQUESTS, [request])
            values = await collector.wait_for(1, 60)
            return [decode(Response, v) for v in values]

    (answer,) = runner.run(roundtrip())
    assert answer.status == "ok" and answer.completion_tokens == 7 and answer.finish_reason == "length"
    assert answer.prompt_tokens > 0 and answer.text != ""


def test_a_batch_job_of_prompts_is_answered_and_its_results_collected(
    stack: tuple[EngineStack, LoopThread], tmp_path: Path
) -> None:
    engine_stack, runner = stack
    lines = [
        {"custom_id": f"q{i}", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": f"batch question {i}"}], "max_tokens": 5,
                  "ignore_eos": True}}
        for i in range(4)
    ] + [{"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "complete me", "max_tokens": 3,
                                                               "ignore_eos": True}}]  # fmt: skip
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"

    async def submit_and_collect() -> tuple[str, int, int]:
        job = await submit_batch(
            KafkaConnection.plaintext(engine_stack.bootstrap), batch, 600, model=MODEL, partitions=4
        )
        written, expected = await collect_results(
            KafkaConnection.plaintext(engine_stack.bootstrap), job.job_id, out, timeout_s=90
        )
        return job.job_id, written, expected

    job_id, written, expected = runner.run(submit_and_collect())
    assert (written, expected) == (5, 5)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["q0", "q1", "q2", "q3", "c"]
    assert all(r["status"] == "ok" and r["request_id"].startswith(f"{job_id}/") for r in results)
    assert [r["usage"]["completion_tokens"] for r in results] == [5, 5, 5, 5, 3]


def test_a_killed_instance_gets_no_new_request_and_none_is_lost(
    stack: tuple[EngineStack, LoopThread],
    client: OpenAI,
    vllm_pair: VllmServers,
) -> None:
    engine_stack, runner = stack
    victim, survivor = [i.instance_id for i in engine_stack.inventory.instances]
    tag = unique("survive")
    stop = threading.Event()
    answers: list[int] = []
    failures: list[str] = []

    def user(index: int) -> None:
        turn = 0
        while not stop.is_set():
            turn += 1
            try:
                answer = client.completions.create(
                    model=MODEL,
                    prompt=f"{tag} user {index} turn {turn}",
                    max_tokens=24,
                    extra_body={"ignore_eos": True},
                    extra_headers={"x-request-id": f"{tag}-u{index}-t{turn}"},
                )
                answers.append(answer.usage.completion_tokens if answer.usage else 0)
            except Exception as exc:  # counted: the assertion below shows them
                failures.append(f"{type(exc).__name__}: {exc}")

    users = [threading.Thread(target=user, args=(i,)) for i in range(4)]
    for thread in users:
        thread.start()
    try:
        time.sleep(3)
        killed_at = time.time()
        vllm_pair.kill(victim)
        wait_until(lambda: not engine_stack.engines.readiness()[victim], 5, "the dispatcher to see the kill")
        seen_after = time.time() - killed_at
        time.sleep(4)
    finally:
        stop.set()
        for thread in users:
            thread.join(60)
        vllm_pair.restart(victim)  # the pair is shared by the session
    assert seen_after <= 2 * engine_stack.options.scrape_s + 0.3, seen_after
    assert failures == [] and answers and set(answers) == {24}, (failures[:3], set(answers))
    decided = [
        d for d in decisions_for(engine_stack, runner, tag, len(answers)) if d.request_id.startswith(tag)
    ]
    assert len({(d.request_id, d.attempt) for d in decided}) == len(decided) >= len(answers)
    # The router hears of the kill through heartbeats: two scrapes, one beat, one batch window.
    blind_s = 2 * engine_stack.options.scrape_s + 2 * engine_stack.options.heartbeat_s + 0.2
    late = [d for d in decided if d.request.ts > killed_at + blind_s]
    assert late and {d.instance_id for d in late} == {survivor}
    assert any(d.instance_id == victim for d in decided if d.request.ts < killed_at)
