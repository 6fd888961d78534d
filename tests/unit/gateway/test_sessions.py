"""A call's session on the wire: the body's ``user`` (or ``X-TokenFleet-Session``) becomes the
request's ``session_id``, a hash of the tenant and the user; the raw user never reaches the bus."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI

from gateway.auth import Authenticator
from gateway.openai_api import parse_body, session_id
from infra.vllm.inventory import parse_inventory
from schemas.codec import encode
from tests.unit.gateway.fakes import MODEL, BusFreeGateway, CountingPrompts, Stack, running


def test_a_session_id_is_a_short_hash_of_the_tenant_and_the_user() -> None:
    alice = session_id("acme", "alice")
    assert len(alice) == 16 and int(alice, 16) >= 0  # 8 bytes, hex
    assert alice == session_id("acme", "alice") != session_id("globex", "alice")
    assert alice != session_id("acme", "bob") and "alice" not in alice
    assert session_id("a", "bc") != session_id("ab", "c")  # the pair, not its concatenation
    assert session_id("acme", "") == ""


def test_parse_body_takes_the_session_over_the_user() -> None:
    body = {"model": "tiny", "prompt": "x", "user": "alice"}
    by_user, call = parse_body("completion", body, "id", "acme", None, {"tiny"})
    assert by_user.session_id == session_id("acme", "alice") and call.user == "alice"
    by_header, _ = parse_body("completion", body, "id", "acme", None, {"tiny"}, session="tab-7")
    assert by_header.session_id == session_id("acme", "tab-7")
    alone, _ = parse_body("completion", {"model": "tiny", "prompt": "x"}, "id", "acme", None, {"tiny"})
    assert alone.session_id == ""


async def ask(stack: Stack, tenant: str, **extra: Any) -> None:
    async with AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0) as client:
        headers = {"X-TokenFleet-Tenant": tenant, **extra.pop("extra_headers", {})}
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            extra_headers=headers,
            **extra,
        )


def test_the_published_request_carries_the_hash_never_the_user() -> None:
    async def main() -> None:
        async with running(auth=Authenticator("proxy")) as stack:
            await ask(stack, "acme", user="alice")
            await ask(stack, "globex", user="alice")
            await ask(stack, "acme")
            await ask(stack, "acme", user="alice", extra_headers={"X-TokenFleet-Session": "tab-7"})
            requests = stack.gateway.requests()
            assert [r.session_id for r in requests] == [
                session_id("acme", "alice"),
                session_id("globex", "alice"),
                "",
                session_id("acme", "tab-7"),
            ]
            assert requests[0].session_id != requests[1].session_id  # two tenants' alice
            for request in requests:
                assert b"alice" not in encode(request) and b"tab-7" not in encode(request)

    asyncio.run(main())


def test_the_demo_users_each_send_their_own_session() -> None:
    from lab.demo_vllm import MODEL as DEMO_MODEL
    from lab.demo_vllm import load

    async def main() -> None:
        async with running() as stack:  # for its fake engine; the demo asks a gateway of its own
            instance = {"id": "e1", "url": stack.engine_url, "model": DEMO_MODEL}
            inventory = parse_inventory({"instances": [instance]})
            gateway = BusFreeGateway(inventory, CountingPrompts(), auth=Authenticator("proxy"))
            async with TestClient(TestServer(gateway.app())) as client:
                figures = await load(str(client.make_url("")).rstrip("/"), 0.3, 2, seed=0)
            assert figures["ok"] >= 2 and figures["failed"] == 0
            sessions = {(r.tenant, r.session_id) for r in gateway.requests()}
        assert sessions == {(f"user-{i}", session_id(f"user-{i}", f"user-{i}")) for i in range(2)}

    asyncio.run(main())
