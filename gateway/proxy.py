"""Run one decided call on its engine and stream the answer back to its HTTP client.

``EngineProxy.run`` is given the HTTP request to answer, the call's record (its id, when it
arrived, how it ended: ``Call``), the request as decided (its prompt included), what the client
asked for beside it (``ClientCall``: streamed or not, usage or not, its model name) and the
``RoutingDecision`` that places it. It finds the chosen engine in the inventory, sends it the
call, always streamed (``infra/vllm/openai_http.py``), so the first token is seen when it
leaves the engine, and answers the client: a streamed call gets each engine event as it comes,
under the call's id (``chatcmpl-<id>``) and the client's model name, then ``data: [DONE]``; the
others get the assembled answer once the engine is done. What it guarantees:

- the bus hears of the attempt as it goes (``publish``: without waiting, to its end even if the
  call is cancelled): a ``ResponseStarted`` on ``tf.first-tokens`` at the first token (streamed
  or not) and exactly one ``Completion`` on ``tf.completions`` however the attempt ends, ``ok``,
  ``error`` or ``aborted`` (the client left), with what the engine sent (``infra/vllm/outcome``);
  a call prefilled on the decision's prefill instance also has, when that prefill step succeeded,
  the end of its prefill leg on ``tf.first-tokens`` before its first token
  (``prefill_decode.prefill_done``: ``prefill_leg`` set, on the prefill instance);
- ``tokenfleet_gateway_added_seconds`` gets, for a streamed call, the time from the call's
  arrival to its first token written to the client, less the engine's own time to that token;
- a client that hangs up (a write fails, or aiohttp cancels the handler) ends the call
  ``client_closed`` and the attempt ``aborted``: leaving the engine call (``generate``) closes the engine
  connection, which makes vLLM abort the generation; nothing of it is logged as an error;
- engine errors become OpenAI error JSON with no engine address in it (the log has it): a
  decision naming an engine not in the inventory is 502; an engine that refuses the call itself
  (HTTP 4xx, e.g. a prompt beyond its context) gives the client its status and its reason, not a
  retry, since any other engine would refuse it too; any other failure before a byte reached the
  client raises ``NothingSent`` (the caller may schedule the call again); a failure after the
  answer began ends the stream with a 502 error event and the call ``error``.

``send_json``, ``ClientGone`` and ``CLIENT_CLOSED`` serve the whole gateway (``server.py`` answers
its errors with them): every answer sent in one piece goes through ``send_json``, so a client
that left is seen wherever it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from gateway.openai_api import ApiError, ClientCall, assembled
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.request_ids import RequestId
from infra import metrics
from infra.vllm import outcome
from infra.vllm.inventory import Inventory
from infra.vllm.openai_http import (
    EngineHttpError,
    Generation,
    engine_call,
    engine_request_id,
)
from infra.vllm.outcome import Status
from infra.vllm.prefill_decode import generate, prefill_done
from schemas.events import Event, InferenceRequest, RoutingDecision
from schemas.topics import COMPLETIONS, FIRST_TOKENS, TopicSpec

# The gateway's call logger, not this module's name: a call's scheduling and its engine side
# are logged under the one name an operator follows.
log = logging.getLogger("gateway.server")

CLIENT_CLOSED = "client_closed"

Publish = Callable[[TopicSpec, Event], None]


class NothingSent(RuntimeError):
    """The engine failed before any byte of the answer reached the client."""


class ClientGone(Exception):
    """The client hung up: reading its body or writing to it failed."""


class Call(Protocol):
    """What the proxy reads and sets of the HTTP call it answers."""

    rid: RequestId  # the answer's ``id`` and ``x-request-id``
    arrived: float  # monotonic: when the call arrived (the gateway's added time counts from it)
    status: str  # how the call ended (the metrics label): set to ``error`` or ``client_closed``


class EngineProxy:
    """Runs decided calls on the engines of ``inventory``, each within ``timeout_s``;
    ``publish`` puts the attempts' events on the bus."""

    def __init__(self, inventory: Inventory, timeout_s: float, publish: Publish) -> None:
        self.inventory = inventory
        self.timeout_s = timeout_s
        self.publish = publish

    async def run(
        self,
        session: aiohttp.ClientSession,
        http: web.Request,
        call: Call,
        request: InferenceRequest,
        client: ClientCall,
        decision: RoutingDecision,
    ) -> web.StreamResponse:
        """Run ``request`` where ``decision`` places it, over ``session``, and answer ``http``
        with it (the module's docstring says how). Raises ``ApiError`` (nothing sent yet) and
        ``NothingSent`` (the engine failed before answering)."""
        ended: Status = "error"  # the attempt, as the bus records it
        generation = Generation()
        stream: web.StreamResponse | None = None
        response_id = call.rid.response_id(client.kind)
        started = False
        sent = 0.0  # monotonic: the call left for the engine

        async def on_event(event: dict[str, Any], raw: bytes) -> None:
            nonlocal stream, started
            first = event.get("choices") and not started
            if first:
                started = True
                engine_ttft = time.monotonic() - sent
                self.publish(FIRST_TOKENS, outcome.first_token(decision, time.time()))
            if not client.stream:
                return
            if not event.get("choices") and not client.include_usage:
                return
            event["id"] = response_id
            event["model"] = client.client_model
            if stream is None:
                stream = await _open_stream(http, call)
            await _send(stream, b"data: " + json.dumps(event).encode() + b"\n\n")
            if first:
                metrics.gateway_added_seconds.observe(time.monotonic() - call.arrived - engine_ttft)

        def on_prefill_done() -> None:
            self.publish(FIRST_TOKENS, prefill_done(decision, time.time()))

        try:
            entry = self.inventory.instance(decision.instance_id)
            if entry is None:
                log.error(
                    "request %s: the scheduler chose %r, not in this gateway's inventory",
                    request.request_id,
                    decision.instance_id,
                )
                raise ApiError(
                    502, "the scheduler chose an engine this gateway cannot reach", type="engine_error"
                )
            path, body = engine_call(request, entry.served_model_name or entry.model)
            prefill = (
                self.inventory.instance(decision.prefill_instance_id)
                if decision.prefill_instance_id
                else None
            )
            sent = time.monotonic()
            try:
                await generate(  # whole, or prefilled first on the decision's prefill instance
                    session,
                    entry.url,
                    path,
                    body,
                    prefill_url=None if prefill is None else prefill.url,
                    timeout_s=self.timeout_s,
                    on_event=on_event,
                    into=generation,
                    request_id=engine_request_id(request),
                    on_prefill_done=on_prefill_done,
                )
            except (EngineHttpError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning(
                    "request %s attempt %d on %s: %s",
                    request.request_id,
                    request.attempt,
                    entry.instance_id,
                    exc,
                )
                if stream is None:
                    if isinstance(exc, EngineHttpError) and 400 <= exc.status < 500:
                        # The engine refused the call itself (e.g. a prompt beyond its context): so
                        # would any other; the client gets the engine's reason, not a retry.
                        raise ApiError(
                            exc.status, f"the engine refused the request: {_engine_reason(exc, entry.url)}"
                        ) from None
                    raise NothingSent(f"the engine {entry.instance_id} failed: {exc}") from None
                call.status = "error"
                error = ApiError(502, "the engine failed during the answer", type="engine_error")
                with contextlib.suppress(ClientGone):
                    await _send(stream, b"data: " + json.dumps(error.body()).encode() + b"\n\n")
                    await _send(stream, None)
                return stream
            if client.stream:
                if stream is None:
                    stream = await _open_stream(http, call)
                await _send(stream, b"data: [DONE]\n\n")
                await _send(stream, None)
                response = stream
            else:
                response = await send_json(http, call, assembled(client, response_id, generation))
            ended = "aborted" if call.status == CLIENT_CLOSED else "ok"
            return response
        except ClientGone:  # a write to the client failed: it left
            ended, call.status = "aborted", CLIENT_CLOSED
            return web.Response(status=499) if stream is None else stream
        except asyncio.CancelledError:  # the client left: leaving closes the engine connection
            ended, call.status = "aborted", CLIENT_CLOSED
            raise
        finally:
            self.publish(COMPLETIONS, outcome.completion(decision, generation, ended, time.time()))


async def send_json(
    http: web.Request,
    call: Call,
    body: dict[str, Any],
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Send a JSON answer now (not when the handler returns), so a client that has left is
    seen here: recorded ``client_closed``, not ``ok``."""
    response = web.json_response(
        body, status=status, headers={**(headers or {}), REQUEST_ID_HEADER: call.rid.id}
    )
    try:
        await response.prepare(http)
        await response.write_eof()
    except ConnectionError:
        call.status = CLIENT_CLOSED
    return response


async def _open_stream(http: web.Request, call: Call) -> web.StreamResponse:
    stream = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            REQUEST_ID_HEADER: call.rid.id,
        }
    )
    try:
        await stream.prepare(http)
    except ConnectionError:
        raise ClientGone from None
    return stream


async def _send(stream: web.StreamResponse, data: bytes | None) -> None:
    """Write ``data`` to the client (None: end the answer); ``ClientGone`` if it has left."""
    try:
        if data is None:
            await stream.write_eof()
        else:
            await stream.write(data)
    except ConnectionError:
        raise ClientGone from None


def _engine_reason(exc: EngineHttpError, url: str) -> str:
    """Why an engine refused a call, for the client: the message of its error JSON, without its
    address."""
    text = str(exc)
    detail = text.split(": ", 1)[1] if text.startswith(url) and ": " in text else ""
    reason = ""
    try:
        parsed = json.loads(detail)
    except ValueError:  # cut short (the first 300 characters): take the message's start
        found = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)', detail)
        reason = found.group(1).replace('\\"', '"') if found else ""
    else:
        if isinstance(parsed, dict):
            inner = parsed.get("error")
            reason = str(
                parsed.get("message") or (inner.get("message") if isinstance(inner, dict) else "") or ""
            )
    reason = reason or f"HTTP {exc.status}"
    where = urlsplit(url)
    for secret in (url, where.netloc, where.hostname or ""):
        if secret:
            reason = reason.replace(secret, "<engine>")
    return reason[:500]
