"""The client's ``x-request-id`` names its call end to end: the id on the bus, the log line, the
response header and the answer's ``id`` (as vLLM names it); unless it cannot be unique."""

from __future__ import annotations

import asyncio
import logging

import pytest
from openai import AsyncOpenAI

from gateway.request_ids import InFlight, RequestIds
from schemas.events import AdmissionDecision, InferenceRequest
from streams.direct import Answer
from tests.unit.gateway.fakes import MODEL, chat_body, place, running


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
            assert stack.engine.engine_ids == ["req-7f3a-1", "req-8b-1"]  # vLLM's id: the attempt's
            assert {c.request_id for c in stack.gateway.completions()} == {"req-7f3a", "req-8b"}
            await client.close()

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    lines = access_lines(caplog)
    assert len(lines) == 2 and lines[0].startswith("req-7f3a ") and lines[1].startswith("req-8b ")


@pytest.mark.parametrize(
    ("second", "why"), [("req-1", "already answered"), ("a b", "visible ASCII"), ("x" * 129, "visible")]
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
    assert (first.id, first.client_id, first.why_not, first.first_attempt) == ("c-1", "c-1", "", 1)
    with pytest.raises(InFlight):
        ids.assign("c-1")  # still running
    ids.ended(first, answered=True, last_attempt=1)
    mine = ids.assign(None)
    assert mine.id.startswith("gw-") and mine.client_id is None
    ids.ended(mine, answered=True, last_attempt=1)
    copied = ids.assign(mine.id)  # a client sending one of ours, answered, gets another
    assert copied.id != mine.id and copied.why_not == "already answered"
    for n in range(3):
        ids.assign(f"later-{n}")
    assert ids.assign("c-1").id == "c-1"  # forgotten after ``remembered`` others


def test_an_id_whose_call_ended_unanswered_is_the_same_call_at_its_next_attempt() -> None:
    ids = RequestIds()
    first = ids.assign("r")
    ids.ended(first, answered=False, last_attempt=3)  # three attempts, then a 503
    again = ids.assign("r")
    assert (again.id, again.why_not, again.first_attempt) == ("r", "", 4)
    ids.ended(again, answered=False, last_attempt=0)  # refused before the bus (a 400)
    assert ids.assign("r").first_attempt == 4


def test_a_call_the_openai_client_retries_after_a_503_keeps_its_id_and_is_answered_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first try is rejected (503 with Retry-After); the ``openai`` client retries with the
    same ``x-request-id``: the retry is attempt 2 of the same request, answered under that id."""
    tries: list[int] = []

    def reject_then_place(request: InferenceRequest) -> Answer:
        tries.append(request.attempt)
        if len(tries) == 1:
            return AdmissionDecision(
                request_id=request.request_id,
                attempt=request.attempt,
                model=request.model,
                slo_class="interactive",
                policy="test",
                action="reject",
                reason="overloaded: no room",
                retry_after_s=0.1,
            )
        return place(request)

    async def main() -> None:
        async with running(schedule=reject_then_place) as stack:
            client = AsyncOpenAI(base_url=stack.base_url, api_key="-", max_retries=2)
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                extra_headers={"x-request-id": "req-retried"},
            )
            assert raw.headers["x-request-id"] == "req-retried" and raw.parse().id == "chatcmpl-req-retried"
            assert [(r.request_id, r.attempt) for r in stack.gateway.requests()] == [
                ("req-retried", 1),
                ("req-retried", 2),
            ]
            assert [(c.request_id, c.attempt, c.status) for c in stack.gateway.completions()] == [
                ("req-retried", 2, "ok")
            ]
            await client.close()

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    lines = access_lines(caplog)
    assert [line.split()[0] for line in lines] == ["req-retried", "req-retried"]
    assert "503" in lines[0] and "from attempt 2" in lines[1]


def test_a_retry_that_comes_while_its_first_try_runs_is_a_409_with_retry_after() -> None:
    async def main() -> None:
        async with running(decision_delay_s=0.5) as stack:
            headers = {"x-request-id": "req-twice"}
            first = asyncio.ensure_future(
                stack.client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            )
            while not stack.gateway.requests():
                await asyncio.sleep(0.01)
            second = await stack.client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert second.status == 409 and second.headers["Retry-After"] == "1"
            assert (await second.json())["error"]["code"] == "request_in_progress"
            assert (await first).status == 200
            assert len(stack.gateway.requests()) == 1

    asyncio.run(main())
