"""A request the broker lost is published again: the call is answered, not a 503."""

from __future__ import annotations

import asyncio

from gateway.server import GatewayOptions
from schemas.events import InferenceRequest
from tests.unit.gateway.fakes import Answer, chat_body, place, running


def test_a_request_whose_first_publish_was_lost_is_answered_after_a_resend() -> None:
    seen: list[str] = []

    def lose_the_first(request: InferenceRequest) -> Answer | None:
        seen.append(request.event_id)
        return place(request) if len(seen) > 1 else None  # the broker lost the first

    async def main() -> None:
        options = GatewayOptions(decision_timeout_s=5.0, resend_after_s=0.2)
        async with running(schedule=lose_the_first, options=options) as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body())
            assert answer.status == 200, await answer.text()
        assert len(seen) == 2 and seen[0] == seen[1]  # the same event, published again

    asyncio.run(main())


def test_no_decision_at_all_is_still_a_503_at_the_decision_timeout() -> None:
    async def main() -> None:
        options = GatewayOptions(decision_timeout_s=0.5, resend_after_s=0.2)
        async with running(schedule=lambda _request: None, options=options) as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body())
            assert answer.status == 503 and "no_decision" in await answer.text()
            assert len(stack.gateway.requests()) == 3  # sent at 0, 0.2 and 0.4 s

    asyncio.run(main())
