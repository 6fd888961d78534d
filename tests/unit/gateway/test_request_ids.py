"""The client's ``x-request-id`` names its call end to end: the id on the bus, the log line, the
response header and the answer's ``id`` (as vLLM names it); unless it cannot be unique."""

from __future__ import annotations

import asyncio
import logging

import pytest
from openai import AsyncOpenAI

from gateway.request_ids import RequestIds
from tests.unit.gateway.fakes import MODEL, chat_body, running


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway.access"]


def test_the_clients_request_id_is_the_bus_id_the_answer_id_the_header_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with running() as stack:
            client = AsyncOpenAI(base_url=stack.base_url, api_key="-", max_retries=0)
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                extra_headers={"x-request-id": "req-7f3a"},
            )
            chat = raw.parse()
            assert raw.headers["x-request-id"] == "req-7f3a" and chat._request_id == "req-7f3a"
            assert chat.id == "chatcmpl-req-7f3a" and chat.choices[0].message.content == "w0 w1 w2 "
            chunks = [
                chunk
                async for chunk in await client.completions.create(
                    model=MODEL,
                    prompt="once upon",
                    max_tokens=3,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers={"x-request-id": "req-8b"},
                )
            ]
            assert {c.id for c in chunks} == {"cmpl-req-8b"} and chunks[-1].usage is not None
            assert [r.request_id for r in stack.gateway.requests()] == ["req-7f3a", "req-8b"]
            assert {c.request_id for c in stack.gateway.completions()} == {"req-7f3a", "req-8b"}
            await client.close()

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    lines = access_lines(caplog)
    assert len(lines) == 2 and lines[0].startswith("req-7f3a ") and lines[1].startswith("req-8b ")


@pytest.mark.parametrize(
    ("second", "why"), [("req-1", "already used"), ("a b", "visible ASCII"), ("x" * 129, "visible")]
)
def test_an_id_that_is_used_or_invalid_is_replaced_and_the_clients_is_logged(
    second: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running() as stack:
            first = await stack.client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "req-1"}
            )
            assert first.headers["x-request-id"] == "req-1"
            again = await stack.client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-request-id": second}
            )
            own = again.headers["x-request-id"]
            assert again.status == 200 and own not in ("req-1", second)
            assert (await again.json())["id"] == f"chatcmpl-{own}"
            assert [r.request_id for r in stack.gateway.requests()] == ["req-1", own]

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    line = access_lines(caplog)[1]
    assert repr(second[:160]) in line and why in line


def test_error_answers_carry_the_request_id_too() -> None:
    async def main() -> None:
        async with running() as stack:
            answer = await stack.client.post(
                "/v1/chat/completions", data="[]", headers={"x-request-id": "bad-1"}
            )
            assert answer.status == 400 and answer.headers["x-request-id"] == "bad-1"

    asyncio.run(main())


def test_request_ids_are_unique_and_memory_is_bounded() -> None:
    ids = RequestIds(remembered=3)
    first = ids.assign("c-1")
    assert (first.id, first.client_id, first.why_not) == ("c-1", "c-1", "")
    mine = ids.assign(None)
    assert mine.id.startswith("gw-") and mine.client_id is None
    copied = ids.assign(mine.id)  # a client sending one of ours gets another
    assert copied.id != mine.id and copied.why_not == "already used"
    for n in range(3):
        ids.assign(f"later-{n}")
    assert ids.assign("c-1").id == "c-1"  # forgotten after ``remembered`` others
