"""Who may ask for what: the tenant comes from the caller's API key, never from a header or the
body; no key or a bad one is 401, a class the key does not allow 403, in OpenAI's error JSON."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import stat
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from gateway.auth import (
    Authenticator,
    KeyEntry,
    KeyFileError,
    add_key,
    key_hash,
    load_keys,
    new_key,
)
from gateway.openai_api import ApiError
from tests.unit.gateway.fakes import MODEL, Stack, chat_body, counted, running

CLASSES = ("interactive", "long_context", "batch")


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, str, str]:
    """A key file with acme's key (interactive only) and globex's (interactive and batch)."""
    path = tmp_path / "keys.yaml"
    acme = add_key(path, "acme", ["interactive"], name="acme-ci", known_classes=CLASSES)
    globex = add_key(path, "globex", ["interactive", "batch"], known_classes=CLASSES)
    return path, acme, globex


def keyed(path: Path) -> Authenticator:
    return Authenticator.from_settings(path, False, CLASSES)


def client(stack: Stack, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0)


async def ask(stack: Stack, key: str, **extra: Any) -> Any:
    async with client(stack, key) as openai_client:
        return await openai_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, **extra
        )


def test_a_key_cannot_act_as_another_tenant_by_header_or_body(keys: tuple[Path, str, str]) -> None:
    path, acme, _ = keys

    async def main() -> None:
        async with running(auth=keyed(path)) as stack:
            await ask(stack, acme)
            await ask(stack, acme, user="globex")  # the body's user is an end-user id: recorded only
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await ask(stack, acme, extra_headers={"X-TokenFleet-Tenant": "globex"})
            assert refused.value.code == "tenant_mismatch"
            await ask(stack, acme, extra_headers={"X-TokenFleet-Tenant": "acme"})  # its own: fine
            requests = stack.gateway.requests()
            assert [r.tenant for r in requests] == ["acme"] * 3
            assert {c.tenant for c in stack.gateway.completions()} == {"acme"}

    asyncio.run(main())


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer nope", "Basic dGY6eA==", "Bearer tf-" + "x" * 43],
)
def test_no_key_or_a_bad_key_is_a_401_and_nothing_is_scheduled(
    authorization: str | None, keys: tuple[Path, str, str]
) -> None:
    path, acme, _ = keys

    async def main() -> None:
        async with running(auth=keyed(path)) as stack:
            headers = {} if authorization is None else {"Authorization": authorization}
            for route in ("/v1/chat/completions", "/v1/completions"):
                answer = await stack.client.post(route, json=chat_body(), headers=headers)
                assert answer.status == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
                error = (await answer.json())["error"]
                assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
            models = await stack.client.get("/v1/models", headers=headers)
            assert models.status == 401
            assert stack.gateway.published == []
            assert (
                await stack.client.get("/v1/models", headers={"Authorization": f"bearer {acme}"})
            ).status == 200

    before = counted("invalid_api_key")
    asyncio.run(main())
    assert counted("invalid_api_key") == before + 2


def test_the_official_client_with_a_wrong_key_gets_an_authentication_error(
    keys: tuple[Path, str, str],
) -> None:
    path, _, _ = keys

    async def main() -> None:
        async with running(auth=keyed(path)) as stack:
            with pytest.raises(openai.AuthenticationError) as refused:
                await ask(stack, "sk-not-ours")
            assert refused.value.code == "invalid_api_key"

    asyncio.run(main())


def test_a_class_the_key_does_not_allow_is_a_403(keys: tuple[Path, str, str]) -> None:
    path, acme, globex = keys

    async def main() -> None:
        async with running(auth=keyed(path)) as stack:
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await ask(stack, acme, extra_headers={"X-TokenFleet-SLO-Class": "batch"})
            assert refused.value.code == "slo_class_not_allowed" and refused.value.status_code == 403
            body: Any = refused.value.body
            assert body["type"] == "permission_denied" and "interactive" in body["message"]
            await ask(stack, globex, extra_headers={"X-TokenFleet-SLO-Class": "batch"})
            with pytest.raises(openai.BadRequestError):  # unknown: 400, before any permission
                await ask(stack, globex, extra_headers={"X-TokenFleet-SLO-Class": "gold"})
            await ask(stack, acme)  # no class declared: one its key allows
            assert [(r.tenant, r.slo_class) for r in stack.gateway.requests()] == [
                ("globex", "batch"),
                ("acme", "interactive"),
            ]

    asyncio.run(main())


def test_an_undeclared_class_is_the_natural_one_if_allowed_else_the_keys_first(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    batch_only = add_key(path, "nightly", ["batch"])
    both = add_key(path, "acme", ["interactive", "long_context"])

    async def main() -> None:
        async with running(auth=keyed(path)) as stack:
            await ask(stack, batch_only)
            await ask(stack, both)
            async with client(stack, both) as openai_client:  # beyond 32k tokens: long_context
                await openai_client.completions.create(model=MODEL, prompt="x" * 140_000, max_tokens=1)
            assert [r.slo_class for r in stack.gateway.requests()] == ["batch", "interactive", "long_context"]

    asyncio.run(main())


def test_without_a_key_file_every_call_is_the_default_tenant(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running() as stack:
            await ask(stack, "anything")
            await ask(stack, "anything", user="acme", extra_headers={"X-TokenFleet-Tenant": "acme"})
            answer = await stack.client.post("/v1/chat/completions", json=chat_body(user="globex"))
            assert answer.status == 200
            assert [r.tenant for r in stack.gateway.requests()] == ["default"] * 3
            assert [r.slo_class for r in stack.gateway.requests()] == [None] * 3  # the scheduler's to say

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "authentication is OFF" in warning


def test_behind_an_authenticating_proxy_the_tenant_header_is_trusted() -> None:
    async def main() -> None:
        async with running(auth=Authenticator.from_settings(None, True, CLASSES)) as stack:
            await ask(stack, "-", extra_headers={"X-TokenFleet-Tenant": "acme"})
            with pytest.raises(openai.AuthenticationError):
                await ask(stack, "-")  # the proxy did not name a tenant
            assert [r.tenant for r in stack.gateway.requests()] == ["acme"]

    asyncio.run(main())


def test_a_new_key_verifies_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    key, entry = new_key("acme", ["interactive", "interactive", "batch"], name="ci")
    assert key.startswith("tf-") and len(key) > 40
    assert entry == KeyEntry(hashlib.sha256(key.encode()).hexdigest(), "acme", ("interactive", "batch"), "ci")
    auth = Authenticator("keys", [entry])
    caller = auth.caller({"Authorization": f"Bearer {key}"})
    assert (caller.tenant, caller.slo_classes, caller.key_name) == ("acme", ("interactive", "batch"), "ci")
    assert caller.may_use("batch") and not caller.may_use("long_context")
    with pytest.raises(ApiError) as refused:
        auth.caller({"Authorization": f"Bearer {key}x"})
    assert refused.value.status == 401
    path = tmp_path / "sub" / "keys.yaml"
    first = add_key(path, "acme", ["batch"])
    second = add_key(path, "globex", ["interactive"], name="web")
    text = path.read_text()
    assert first not in text and second not in text and key_hash(second) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [(e.tenant, e.name) for e in load_keys(path)] == [("acme", ""), ("globex", "web")]
    with pytest.raises(ValueError, match="tenant"):
        new_key("", ["batch"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("keys: [", "not valid YAML"),
        ("- a", "a mapping with one list"),
        ("keys: [1]", "must be a mapping"),
        ("keys: [{sha256: abc, tenant: t, slo_classes: [batch]}]", "64 hex digits"),
        (f"keys: [{{sha256: {'a' * 64}, tenant: '', slo_classes: [batch]}}]", "'tenant'"),
        (f"keys: [{{sha256: {'a' * 64}, tenant: t, slo_classes: []}}]", "'slo_classes'"),
        (f"keys: [{{sha256: {'a' * 64}, tenant: t, slo_classes: [gold]}}]", "unknown SLO classes"),
        (f"keys: [{{sha256: {'a' * 64}, tenant: t, slo_classes: [batch], role: admin}}]", "unknown fields"),
        (
            f"keys: [{{sha256: {'a' * 64}, tenant: t, slo_classes: [batch]}}, "
            f"{{sha256: {'A' * 64}, tenant: u, slo_classes: [batch]}}]",
            "twice",
        ),
    ],
)
def test_a_bad_key_file_is_one_clear_error(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(KeyFileError, match=message):
        load_keys(path, CLASSES)


def test_settings_choose_the_mode_and_refuse_both_at_once(tmp_path: Path) -> None:
    assert Authenticator.from_settings(None, False).mode == "open"
    assert Authenticator.from_settings(None, True).mode == "proxy"
    path = tmp_path / "keys.yaml"
    add_key(path, "acme", ["batch"])
    assert Authenticator.from_settings(path, False).mode == "keys"
    with pytest.raises(KeyFileError, match="do not also set TOKENFLEET_API_KEYS"):
        Authenticator.from_settings(path, True)
    with pytest.raises(KeyFileError, match="cannot read"):
        Authenticator.from_settings(tmp_path / "none.yaml", False)


def test_the_key_file_is_read_again_when_it_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.yaml"
    first = add_key(path, "acme", ["batch"])
    auth = Authenticator("keys", load_keys(path), path, CLASSES, reload_s=0.0)
    second = add_key(path, "globex", ["batch"])
    assert auth.caller({"Authorization": f"Bearer {second}"}).tenant == "globex"
    path.write_text("keys: [")  # a broken edit: the keys read before stay
    assert auth.caller({"Authorization": f"Bearer {first}"}).tenant == "acme"
    assert any("not valid YAML" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    path.write_text(f"keys: [{{sha256: {key_hash(second)}, tenant: globex, slo_classes: [batch]}}]\n")
    with pytest.raises(ApiError):  # first revoked
        auth.caller({"Authorization": f"Bearer {first}"})


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["gateway"], {"TOKENFLEET_API_KEYS": "/no/such/keys.yaml"}, "cannot read the API key file"),
        (
            ["gateway"],
            {"TOKENFLEET_API_KEYS": "/k.yaml", "TOKENFLEET_TRUST_TENANT_HEADER": "1"},
            "do not also",
        ),
    ],
)
def test_the_gateway_command_says_what_is_wrong_with_its_keys_in_one_line(
    args: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import main

    for name in ("TOKENFLEET_KAFKA_BOOTSTRAP", "TOKENFLEET_API_KEYS", "TOKENFLEET_TRUST_TENANT_HEADER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
