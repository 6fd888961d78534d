"""The pure parts of the real-engine path: the inventory, the OpenAI API mapping, prompts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.prompt_blocks import ROOT, block_hash, chained_block_hashes
from gateway.openai_api import ApiError, assembled, parse_body, rejection
from infra.prompts import PromptError, Prompts
from infra.vllm.inventory import InventoryError, dump_inventory, load_inventory, parse_inventory
from infra.vllm.openai_http import Generation, engine_call
from local.tiny_model import ensure_tiny_model
from schemas.codec import DecodeError, decode, encode
from schemas.events import AdmissionDecision, ChatMessage, InferenceRequest, Sampling

INVENTORY = {
    "models": {"tiny": {"version": "v1", "tokenizer": "model"}},
    "instances": [
        {"id": "a", "url": "http://127.0.0.1:8001/", "model": "tiny", "kv_events": "tcp://127.0.0.1:5557"},
        {"id": "b", "url": "http://127.0.0.1:8002", "model": "tiny", "dc": "eu", "version": "v2"}
        | {"role": "decode", "kv_bytes_per_token": 2048, "max_num_seqs": 32, "max_num_batched_tokens": 2048},
    ],
}


def test_inventory_round_trips_and_fills_defaults(tmp_path: Path) -> None:
    inventory = parse_inventory(INVENTORY, base=tmp_path)
    a, b = inventory.instances
    assert (a.url, a.version, a.dc, a.served_model_name, a.kv_events) == (
        "http://127.0.0.1:8001", "v1", "local", "tiny", "tcp://127.0.0.1:5557",
    )  # fmt: skip
    assert (b.dc, b.version, b.kv_events) == ("eu", "v2", None)
    assert (a.role, a.kv_bytes_per_token, b.role, b.kv_bytes_per_token) == ("both", 0, "decode", 2048)
    limits = [(i.max_num_seqs, i.max_num_batched_tokens) for i in (a, b)]
    assert limits == [(0, 0), (32, 2048)]  # 0: not known
    assert inventory.models["tiny"].tokenizer == tmp_path / "model"
    path = tmp_path / "inventory.yaml"
    path.write_text(dump_inventory(inventory))
    assert load_inventory(path) == inventory


ONE = {"id": "a", "url": "http://x", "model": "m"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"instances": []}, "non-empty list"),
        ({"instances": [{"id": "a", "url": "ftp://x", "model": "m"}]}, "not an http"),
        ({"instances": [{"id": "a", "url": "http://x", "model": "m", "colour": 1}]}, "unknown keys"),
        ({"instances": [{"url": "http://x", "model": "m"}]}, "'id' is required"),
        ({"instances": [{"id": "a", "url": "http://x", "model": "m"}] * 2}, "duplicate instance ids"),
        ({"instances": [{"id": "a", "url": "http://x", "model": "m", "kv_events": "x:1"}]}, "ZMQ endpoint"),
        ({"instances": [{"id": "a", "url": "http://x", "model": "m", "role": "kv_both"}]}, "prefill, decode"),
        ({"instances": [{"id": "a", "url": "http://x", "model": "m", "kv_bytes_per_token": -1}]}, "kv_bytes"),
        ({"instances": [{**ONE, "max_num_seqs": 1.5}]}, "max_num_seqs"),
        ({"instances": [{**ONE, "max_num_batched_tokens": -1}]}, "max_num_batched_tokens"),
    ],
)
def test_inventory_errors_say_what_is_wrong(change: dict[str, object], message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        parse_inventory({**INVENTORY, **change})


def test_a_missing_or_broken_inventory_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("instances: [")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load_inventory(tmp_path / "bad.yaml")


def test_block_hashes_chain_full_blocks_only() -> None:
    ids = list(range(1200))
    hashes = chained_block_hashes(ids)
    assert len(hashes) == 2
    assert hashes[0] == block_hash(ROOT, ids[:512]) and hashes[1] == block_hash(hashes[0], ids[512:1024])
    assert chained_block_hashes(ids[:1100]) == hashes  # a prefix shares its blocks
    assert chained_block_hashes([7, *ids[1:]])[0] != hashes[0]


def test_a_request_carries_at_most_one_prompt_and_token_ids_count_themselves() -> None:
    counted = InferenceRequest(request_id="r", model="m", prompt_token_ids=(5, 6, 7), output_budget=2)
    assert counted.input_tokens == 3 and counted.has_prompt
    assert decode(InferenceRequest, encode(counted)) == counted
    for bad in (
        b'{"request_id": "r", "model": "m", "output_budget": 2}',
        b'{"request_id": "r", "model": "m", "output_budget": 2, "prompt": "x", "prompt_token_ids": [1]}',
        b'{"request_id": "r", "model": "m", "output_budget": 2, "messages": []}',
        b'{"request_id": "r", "model": "m", "output_budget": 2, "prompt": "x", "sampling": {"top_p": 0}}',
        b'{"request_id": "r", "model": "m", "output_budget": 2, "messages": [{"role": "bot"}]}',
    ):
        with pytest.raises(DecodeError):
            decode(InferenceRequest, bad)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Prompts:
    model = ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model", "tiny")
    return Prompts.from_dirs({"tiny": model})


def test_prompts_are_counted_and_hashed_by_the_models_tokenizer(prompts: Prompts) -> None:
    text = "the same long preamble " * 200
    first = prompts.complete(
        InferenceRequest(request_id="a", model="tiny", prompt=text + "one", output_budget=4)
    )
    second = prompts.complete(
        InferenceRequest(request_id="b", model="tiny", prompt=text + "two", output_budget=4)
    )
    assert first.input_tokens > 1024 and len(first.prompt_block_hashes) == first.input_tokens // 512
    assert first.prompt_block_hashes[:2] == second.prompt_block_hashes[:2]  # shared prefix, shared blocks
    chat = prompts.complete(
        InferenceRequest(
            request_id="c", model="tiny", messages=(ChatMessage(role="user", content=text),), output_budget=4
        )
    )
    assert chat.input_tokens > first.input_tokens // 2
    with pytest.raises(PromptError, match="no tokenizer"):
        prompts.complete(InferenceRequest(request_id="d", model="other", prompt="x", output_budget=1))
    given = InferenceRequest(
        request_id="e", model="other", prompt="x", input_tokens=9, prompt_block_hashes=(1,), output_budget=1
    )
    assert prompts.complete(given) is given  # counted by its producer: left alone


def test_a_long_prompt_off_the_loop_is_counted_and_hashed_as_inline(prompts: Prompts) -> None:
    """A prompt past THREAD_PROMPT_CHARS goes to a worker thread (bench.prompt_stall measures
    what that saves the event loop); the answer is the same as inline, chats included."""
    from infra.prompts import THREAD_PROMPT_CHARS

    text = "a long shared document, " * (THREAD_PROMPT_CHARS // 20)
    for request in (
        InferenceRequest(request_id="p", model="tiny", prompt=text, output_budget=4),
        InferenceRequest(
            request_id="m", model="tiny", messages=(ChatMessage(role="user", content=text),), output_budget=4
        ),
    ):
        off_loop = asyncio.run(prompts.complete_off_loop(request))
        assert off_loop == prompts.complete(request) and off_loop.input_tokens > 1024


def test_openai_bodies_become_requests_and_errors_are_openai_shaped() -> None:
    chat, call = parse_body(
        "chat",
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "max_tokens": 5, "temperature": 0.5, "stop": "END", "stream": True, "ignore_eos": True},
        "id-1", "tenant-a", None, {"tiny"},
    )  # fmt: skip
    assert chat.messages == (ChatMessage(role="user", content="hi"),) and chat.output_budget == 5
    assert chat.sampling == Sampling(temperature=0.5, stop=("END",), ignore_eos=True) and chat.reply == "http"
    assert call.stream and not call.include_usage
    path, body = engine_call(chat, "served")
    assert path == "/v1/chat/completions" and body["model"] == "served" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    text, _ = parse_body("completion", {"model": "tiny", "prompt": [[1, 2, 3]]}, "id-2", "t", None, {"tiny"})
    assert text.prompt_token_ids == (1, 2, 3) and text.output_budget == 16
    for kind, body_, status in (
        ("chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
        ("chat", {"model": "tiny", "messages": []}, 400),
        ("chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400),
        ("completion", {"model": "tiny", "prompt": ""}, 400),
        ("completion", {"model": "tiny", "prompt": "x", "max_tokens": -1}, 400),
        ("completion", ["not", "an", "object"], 400),
    ):
        with pytest.raises(ApiError) as raised:
            parse_body(kind, body_, "id", "t", None, {"tiny"})  # type: ignore[arg-type]
        assert raised.value.status == status and raised.value.body()["error"]["message"]


def test_assembled_answers_and_rejections_map_to_http() -> None:
    _, call = parse_body("completion", {"model": "tiny", "prompt": "x"}, "id", "t", None, {"tiny"})
    answer = assembled(
        call, "id", Generation(text="abc", finish_reason="length", prompt_tokens=3, completion_tokens=2)
    )
    assert answer["choices"][0]["text"] == "abc" and answer["usage"]["total_tokens"] == 5
    reject = AdmissionDecision(request_id="r", model="m", slo_class="interactive", action="reject",
                               reason="over_quota: tenant t", policy="slomax", retry_after_s=2.2)  # fmt: skip
    error = rejection(reject)
    assert (error.status, error.code, error.headers) == (429, "over_quota", {"Retry-After": "3"})
    shed = rejection(reject.model_copy(update={"reason": "cannot_meet_slo: ttft", "retry_after_s": None}))
    assert (shed.status, shed.headers) == (503, {})


EXAMPLE_INVENTORY = str(Path(__file__).resolve().parents[3] / "examples" / "inventory.yaml")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["gateway"], {}, "no engine inventory"),  # named before the broker is looked for
        (["gateway", "--inventory", EXAMPLE_INVENTORY], {}, "no Kafka broker configured"),
        (["gateway"], {"TOKENFLEET_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, "no engine inventory"),
        (
            ["gateway", "--inventory", "/no/such.yaml"],
            {"TOKENFLEET_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
            "cannot read",
        ),
        (["gateway", "--port", "0", "--reuse-port"], {}, "--reuse-port"),  # port 0 alone: any free one
        (["fleet", "--engine", "gpu"], {}, "--engine must be emulated or vllm"),
        (["fleet", "--engine", "vllm"], {}, "no engine inventory"),
        (["batch", "results", "job-1", "--out", "x.jsonl"], {}, "no Kafka broker configured"),
    ],
)
def test_real_engine_commands_say_what_is_wrong_in_one_line(
    args: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import main

    monkeypatch.delenv("TOKENFLEET_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("TOKENFLEET_INVENTORY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
