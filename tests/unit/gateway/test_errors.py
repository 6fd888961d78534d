"""Every error the gateway answers is OpenAI's error JSON, named by the client's fields, and tells
the client nothing only an operator should know (engine addresses)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.unit.gateway.fakes import MODEL, FakeEngine, Stack, chat_body, counted, running, tracebacks


def error_of(payload: Any) -> dict[str, Any]:
    assert set(payload) == {"error"}, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize("body", ["[1, 2]", "null", '"x"', "42", "true"])
def test_a_body_that_is_not_an_object_is_a_400_not_a_500(body: str, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post("/v1/chat/completions", data=body)
            assert answer.status == 400
            error = error_of(await answer.json())
            assert error["type"] == "invalid_request_error" and "JSON object" in error["message"]
            assert stack.gateway.published == []

    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert tracebacks(caplog.records) == []


@pytest.mark.parametrize(
    ("body", "code"),
    [("{", "invalid_json"), ("[" * 100_000, "invalid_json"), (b'{"prompt": "\xff\xfe"}', "invalid_encoding")],
)
def test_a_body_that_is_not_json_is_a_400(
    body: str | bytes, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post("/v1/completions", data=body)
            assert answer.status == 400
            error = error_of(await answer.json())
            assert error["code"] == code
            if code == "invalid_encoding":
                assert error["message"] == "the body is not valid UTF-8 (byte 12 of 16)"

    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert tracebacks(caplog.records) == []


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens"),
        ({"temperature": 9}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"user": 7}, "user"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"n": 3}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"model": None}, "model"),
    ],
)
def test_errors_name_the_clients_field_not_an_internal_one(change: dict[str, Any], param: str) -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body(**change))
            assert answer.status == 400
            error = error_of(await answer.json())
            assert error["param"] == param and error["type"] == "invalid_request_error", error
            assert "output_budget" not in json.dumps(error) and "sampling" not in error["message"]

    asyncio.run(main())


def test_a_prompt_the_tokenizer_finds_empty_is_a_400_on_the_prompt() -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post("/v1/completions", json={"model": MODEL, "prompt": "EMPTY"})
            assert answer.status == 400 and error_of(await answer.json())["param"] == "prompt"

    asyncio.run(main())


def test_a_body_beyond_the_limit_is_a_413_in_openais_shape() -> None:
    async def main() -> None:
        async with running() as stack:
            huge = chat_body("x" * (4 * 1024 * 1024 + 1000))
            answer = await stack.client.post("/v1/chat/completions", json=huge)
            assert answer.status == 413 and answer.content_type == "application/json"
            error = error_of(await answer.json())
            assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"

    asyncio.run(main())


def test_an_unknown_slo_class_is_a_400_and_nothing_is_scheduled() -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post(
                "/v1/chat/completions", json=chat_body(), headers={"X-TokenFleet-SLO-Class": "platinum"}
            )
            assert answer.status == 400
            error = error_of(await answer.json())
            assert error["code"] == "invalid_slo_class" and "interactive" in error["message"]
            assert stack.gateway.requests() == []
            known = await stack.client.post(
                "/v1/chat/completions", json=chat_body(), headers={"X-TokenFleet-SLO-Class": "batch"}
            )
            assert known.status == 200 and stack.gateway.requests()[0].slo_class == "batch"

    asyncio.run(main())


def engine_hidden(stack: Stack, text: str) -> None:
    port = stack.engine_url.rsplit(":", 1)[1]
    assert stack.engine_url not in text and "127.0.0.1" not in text and port not in text, text


VLLM_400 = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested 4203 "
    "tokens (4199 in the messages, 4 in the completion). Please reduce the length.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize("stream", [False, True])
def test_an_engines_400_reaches_the_client_without_the_engines_address(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running(FakeEngine(refuse=(400, VLLM_400))) as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body(stream=stream))
            assert answer.status == 400
            text = await answer.text()
            engine_hidden(stack, text)
            error = error_of(json.loads(text))
            assert (
                "engine refused" in error["message"] and "maximum context length is 4096" in error["message"]
            )
            assert len(stack.gateway.requests()) == 1  # not tried again
            client = AsyncOpenAI(base_url=stack.base_url, api_key="-", max_retries=0)
            with pytest.raises(openai.BadRequestError, match="maximum context length"):
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}], stream=stream
                )
            await client.close()

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    assert any("127.0.0.1" in r.getMessage() for r in caplog.records)  # the operator sees where


def test_an_engine_that_keeps_failing_is_a_502_without_its_address() -> None:
    async def main() -> None:
        async with running(FakeEngine(refuse=(500, {"message": "boom"})), options=fast_retries()) as stack:
            answer = await stack.client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert answer.status == 502
            text = await answer.text()
            engine_hidden(stack, text)
            assert error_of(json.loads(text))["type"] == "engine_error"
            assert [c.status for c in stack.gateway.completions()] == ["error"] * 2

    asyncio.run(main())


def test_an_engine_that_breaks_mid_answer_sends_an_error_event_without_its_address() -> None:
    async def main() -> None:
        before = counted("error")
        async with running(FakeEngine(chunks=5, die_after=2)) as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert answer.status == 200
            text = (await answer.read()).decode()
            engine_hidden(stack, text)
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            assert len(events) == 3 and error_of(events[-1])["type"] == "engine_error"
            assert [c.status for c in stack.gateway.completions()] == ["error"]
        assert counted("error") == before + 1

    asyncio.run(main())


def test_aiohttps_own_errors_are_openai_json_too() -> None:
    async def main() -> None:
        async with running() as stack:
            missing = await stack.client.post("/v1/embeddings", json={})
            assert missing.status == 404 and error_of(await missing.json())["code"] == "not_found"
            wrong = await stack.client.get("/v1/chat/completions")
            assert wrong.status == 405 and "POST" in wrong.headers["Allow"]
            assert error_of(await wrong.json())["type"] == "invalid_request_error"

    asyncio.run(main())


def fast_retries() -> Any:
    from gateway.server import GatewayOptions

    return GatewayOptions(attempts=2, retry_backoff_s=0.0)


def test_body_fields_the_gateway_does_not_use_are_named_in_the_access_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with running() as stack:
            body = chat_body(top_k=5, repetition_penalty=1.1)
            answer = await stack.client.post("/v1/chat/completions", json=body)
            assert answer.status == 200

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    (line,) = [r.getMessage() for r in caplog.records if r.name == "gateway.access"]
    assert line.endswith("(body fields ignored: repetition_penalty, top_k)")
