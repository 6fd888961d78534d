"""Prefill on one vLLM server, decode on another: vLLM's disaggregated serving, run by its client.

vLLM moves a prompt's KV cache between two servers through a KV connector (the servers' own
``--kv-transfer-config``); the client drives the two steps:

1. **prefill** (``prefill``): the prefill server gets the call with one output token, not
   streamed, carrying ``PREFILL_KV_TRANSFER_PARAMS`` (``do_remote_decode``). It computes the
   prompt's KV cache, hands it to its connector and answers with the ``kv_transfer_params`` the
   decode server needs to fetch it: a connector that moves blocks between engines (NIXL) names
   the remote engine and blocks there; one that finds the cache by the prompt itself (vLLM's
   example shared-storage connector) answers none.
2. **decode** (``decode``): the decode server gets the same call (prompt, sampling, budget,
   streamed) plus those parameters when there are any. It loads what the connector has of the
   prompt instead of computing it, computes the rest and generates the whole answer, its first
   token included: the prefill's one token is discarded.

``prefill_then_decode`` runs both and streams the decode server's answer as the vLLM adapter
streams a call (``infra.vllm.openai_http.stream_generation``). It falls back to **local
prefill**, the whole call on the decode server without parameters, when the caller says the
prefill pool is busy, or when the prefill step fails: the server cannot be reached or breaks
the connection (``failed``), answers any status but 200 (``refused``), answers something that
is not a JSON object with an object or null as ``kv_transfer_params`` (``failed``), or does
not answer within ``prefill_timeout_s`` (``timeout``; closing the connection makes vLLM abort
the call). The decode step is never retried: its failure is the attempt's, raised as
``stream_generation`` raises it.

The end of a successful prefill step is the end of the request's prefill leg: the caller's
``on_prefill_done`` hears of it before the decode step starts, and reports it to the scheduler as
``prefill_done``'s event (a ``ResponseStarted`` with ``prefill_leg``, on the prefill instance),
which calibrates its latency model on the prefill instance's own first-token time; the
client's first token, later on the decode instance, includes the transfer. A call that fell back
to local prefill ran whole: no such event, its ordinary first token is the truth.

Whether the decode server really loaded a transferred cache is the connector's business: the
client sees it only in the decode's usage (``Generation.cached_tokens``) and in that server's
``/metrics`` (``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``).
"""

# The two steps follow vLLM's own proxy for its disaggregated-serving tests
# (vllm-project/vllm, tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, commit
# 030ea52effcb05071543c8c42b8f0145e94cee43): same request id on both servers, the prefill call
# unstreamed with max_tokens 1 and without min_tokens, its kv_transfer_params passed on as is.
# Timing the prefill leg apart from the client's first token follows Dynamo's prefill router,
# which records when the prefill's result reached it (ai-dynamo/dynamo,
# lib/llm/src/kv_router/prefill_router/execution.rs, ``execute_prefill``: record_prefill_complete,
# commit 0243c51bb6e8958be89df4978b5761677c9adc23).

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from infra.errors import first_line
from infra.vllm.openai_http import Generation, stream_generation
from infra.vllm.outcome import first_token
from schemas.events import ResponseStarted, RoutingDecision

PREFILL_KV_TRANSFER_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
DEFAULT_PREFILL_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 5.0
# A prefill of one token cannot honour a minimum output length (vLLM refuses min > max).
_NOT_FOR_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")


class PrefillError(RuntimeError):
    """The prefill step failed; ``reason`` is ``timeout``, ``refused: ...`` or ``failed: ...``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PrefillDecode:
    """How one call ran. ``disaggregated``: the prefill step succeeded and the decode carried
    its ``kv_transfer_params`` (None: the prefill server answered none); otherwise the decode
    server ran the whole call and ``fallback`` says why (``busy``, ``timeout``, ``refused: ...``,
    ``failed: ...``; empty when disaggregated). ``prefill_s``: wall seconds the prefill step took
    (0 when it was not tried)."""

    generation: Generation
    disaggregated: bool
    fallback: str
    kv_transfer_params: dict[str, Any] | None
    prefill_s: float


def prefill_done(decision: RoutingDecision, now: float) -> ResponseStarted:
    """The end of ``decision``'s prefill leg at ``now`` (wall seconds), on its prefill instance:
    ``prefill_leg`` set, ``ttft_s`` = ``now`` - the request's ``ts`` (as a first token's)."""
    return first_token(decision, now, prefill_leg=True)


def prefill_call(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill step's body for the engine call ``body`` (``engine_call``'s): one output
    token, not streamed, no minimum length, ``PREFILL_KV_TRANSFER_PARAMS``; the rest as is."""
    call = {k: v for k, v in body.items() if k not in _NOT_FOR_PREFILL}
    call["stream"] = False
    call["max_tokens"] = 1
    if "max_completion_tokens" in call:
        call["max_completion_tokens"] = 1
    call["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    return call


def decode_call(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decode step's body: ``body`` itself, plus ``kv_transfer_params`` when there are any."""
    call = dict(body)
    if kv_transfer_params is not None:
        call["kv_transfer_params"] = dict(kv_transfer_params)
    return call


async def prefill(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    body: Mapping[str, Any],
    timeout_s: float,
    request_id: str | None = None,
) -> dict[str, Any] | None:
    """Run the prefill step of ``body`` on the server at ``url`` and return the
    ``kv_transfer_params`` it answered (None: none). Raises ``PrefillError`` (the module
    docstring lists the failures); cancelling it closes the connection."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, _CONNECT_TIMEOUT_S))
    headers = None if request_id is None else {"X-Request-Id": request_id}
    try:
        async with session.post(
            url + path, json=prefill_call(body), timeout=timeout, headers=headers
        ) as response:
            text = await response.text()
            status = response.status
    except TimeoutError as exc:
        raise PrefillError("timeout") from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise PrefillError(f"failed: {url}: {first_line(exc)}") from exc
    if status != 200:
        raise PrefillError(f"refused: {url} answered {status}: {text[:200]}")
    try:
        answer = json.loads(text)
    except ValueError:
        raise PrefillError(f"failed: {url} answered no JSON: {text[:100]!r}") from None
    if not isinstance(answer, dict):
        raise PrefillError(f"failed: {url} answered no JSON object: {text[:100]!r}")
    params = answer.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise PrefillError(f"failed: {url} answered no kv_transfer_params object: {text[:100]!r}")
    return params


async def decode(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    body: Mapping[str, Any],
    kv_transfer_params: Mapping[str, Any] | None,
    on_event: Callable[[dict[str, Any], bytes], Awaitable[None]] | None = None,
    timeout_s: float | None = None,
    into: Generation | None = None,
    request_id: str | None = None,
) -> Generation:
    """Stream the decode step (``decode_call``) from the server at ``url``:
    ``stream_generation``'s contract, arguments and errors."""
    return await stream_generation(
        session,
        url,
        path,
        decode_call(body, kv_transfer_params),
        on_event=on_event,
        timeout_s=timeout_s,
        into=into,
        request_id=request_id,
    )


async def prefill_then_decode(
    session: aiohttp.ClientSession,
    prefill_url: str,
    decode_url: str,
    path: str,
    body: Mapping[str, Any],
    *,
    prefill_busy: bool = False,
    prefill_timeout_s: float = DEFAULT_PREFILL_TIMEOUT_S,
    timeout_s: float | None = None,
    on_event: Callable[[dict[str, Any], bytes], Awaitable[None]] | None = None,
    into: Generation | None = None,
    request_id: str | None = None,
    on_prefill_done: Callable[[], None] | None = None,
) -> PrefillDecode:
    """Run the engine call ``(path, body)`` (``engine_call``'s, streamed) prefilled on
    ``prefill_url`` and decoded on ``decode_url``, or wholly on ``decode_url`` when the prefill
    pool is busy or the prefill step fails (module docstring).

    ``timeout_s`` bounds both steps together (None: no bound); the prefill step gets at most
    ``prefill_timeout_s`` of it, the decode step what is left (``TimeoutError`` when nothing is).
    ``on_event``, ``into`` and ``request_id`` (sent to both servers) are ``stream_generation``'s.
    ``on_prefill_done`` is called once when the prefill step succeeded, before the decode step
    starts (never on a fallback). Raises what the decode step raises; a failed prefill step
    never raises."""
    started = time.monotonic()
    params: dict[str, Any] | None = None
    fallback = "busy" if prefill_busy else ""
    prefill_s = 0.0
    if not prefill_busy:
        budget = prefill_timeout_s if timeout_s is None else min(prefill_timeout_s, timeout_s)
        try:
            params = await prefill(session, prefill_url, path, body, budget, request_id)
        except PrefillError as exc:
            fallback = exc.reason
        prefill_s = time.monotonic() - started
        if not fallback and on_prefill_done is not None:
            on_prefill_done()
    left = None if timeout_s is None else timeout_s - (time.monotonic() - started)
    if left is not None and left <= 0:
        raise TimeoutError("no time left for the decode step")
    generation = await decode(
        session,
        decode_url,
        path,
        body,
        params,
        on_event=on_event,
        timeout_s=left,
        into=into,
        request_id=request_id,
    )
    return PrefillDecode(generation, not fallback, fallback, params, prefill_s)


async def generate(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    body: Mapping[str, Any],
    *,
    prefill_url: str | None = None,
    timeout_s: float | None = None,
    on_event: Callable[[dict[str, Any], bytes], Awaitable[None]] | None = None,
    into: Generation | None = None,
    request_id: str | None = None,
    on_prefill_done: Callable[[], None] | None = None,
) -> str:
    """Run the engine call on ``url``: whole (the decode step without transfer parameters, as
    local prefill runs it), or prefilled first on ``prefill_url`` when one is given
    (``prefill_then_decode``, which calls ``on_prefill_done`` when the prefill step succeeded).
    Returns why a disaggregated call fell back to local prefill ("" when it did not, or was
    whole); raises as ``stream_generation`` does."""
    if prefill_url is None:
        await decode(
            session, url, path, body, None,
            on_event=on_event, timeout_s=timeout_s, into=into, request_id=request_id,
        )  # fmt: skip
        return ""
    ran = await prefill_then_decode(
        session, prefill_url, url, path, body,
        timeout_s=timeout_s, on_event=on_event, into=into, request_id=request_id,
        on_prefill_done=on_prefill_done,
    )  # fmt: skip
    return ran.fallback
