"""One generation on an OpenAI-compatible engine (vLLM), streamed, with the timings a proxy sees.

``engine_call`` turns an ``InferenceRequest`` into the engine's endpoint and JSON body (chat for
``messages``, completion for ``prompt`` / ``prompt_token_ids``; always streamed, with usage, so
the first token is seen when it leaves the engine). ``stream_generation`` runs it and returns a
``Generation``; ``on_event`` sees each decoded SSE event first (the gateway forwards them).
Closing the HTTP connection before the end is how a generation is aborted: vLLM aborts a
request whose client disconnected.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from schemas.events import InferenceRequest


class EngineHttpError(RuntimeError):
    """The engine refused the request or broke the stream; ``status`` is its HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Generation:
    """What came back. Times are ``time.time()`` seconds; ``first_token_ts`` is None if no
    token came (e.g. an abort before the first)."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    chunks: int = 0


def engine_call(request: InferenceRequest, served_model_name: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of the engine call that executes ``request``."""
    body: dict[str, Any] = {
        "model": served_model_name,
        "max_tokens": request.output_budget,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sampling = request.sampling
    for name in ("temperature", "top_p", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if request.messages is not None:
        body["messages"] = [m.model_dump() for m in request.messages]
        return "/v1/chat/completions", body
    if request.prompt_token_ids is not None:
        body["prompt"] = list(request.prompt_token_ids)
    elif request.prompt is not None:
        body["prompt"] = request.prompt
    else:
        raise ValueError(f"request {request.request_id!r} carries no prompt: a real engine cannot run it")
    return "/v1/completions", body


def engine_request_id(request: InferenceRequest) -> str:
    """The id the engine knows an attempt by (``X-Request-Id``, which vLLM takes as its request
    id): ``<request_id>-<attempt>``, so an operator follows a call from the gateway's log into
    the engine's, and two attempts of one request are two requests there."""
    return f"{request.request_id}-{request.attempt}"


async def stream_generation(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    body: dict[str, Any],
    on_event: Callable[[dict[str, Any], bytes], Awaitable[None]] | None = None,
    timeout_s: float | None = None,
    into: Generation | None = None,
    request_id: str | None = None,
) -> Generation:
    """POST ``body`` to ``url + path`` as a stream and read it to its end, into ``into`` (a new
    ``Generation`` if None; given one, what came before a failure stays readable there);
    ``request_id``: sent as ``X-Request-Id`` (``engine_request_id``).

    Raises ``EngineHttpError`` (refused: its status; a broken stream: 0) and lets
    ``aiohttp.ClientError`` / ``TimeoutError`` through; cancelling it closes the connection
    (the engine aborts the request)."""
    generation = Generation() if into is None else into
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=5.0)
    headers = None if request_id is None else {"X-Request-Id": request_id}
    async with session.post(url + path, json=body, timeout=timeout, headers=headers) as response:
        if response.status != 200:
            text = (await response.text())[:300]
            raise EngineHttpError(f"{url} answered {response.status}: {text}", response.status)
        ended = False
        async for raw in _sse_lines(response):
            if raw == b"[DONE]":
                ended = True
                break
            try:
                event = json.loads(raw)
            except ValueError:
                raise EngineHttpError(f"{url} sent an undecodable stream event: {raw[:100]!r}") from None
            if "error" in event:
                raise EngineHttpError(f"{url} failed the request: {str(event['error'])[:300]}")
            _take(generation, event)
            if on_event is not None:
                await on_event(event, raw)
        if not ended:
            raise EngineHttpError(f"{url} ended the stream before [DONE]")
        # Read on to the response's end (it follows [DONE], often in a later write): a response
        # read to its end gives its connection back to the session's pool; one left unread is
        # closed, and the next call to that engine would connect anew (and the engine would see
        # a client that hung up).
        await response.content.read()
    return generation


def _take(generation: Generation, event: dict[str, Any]) -> None:
    now = time.time()
    for choice in event.get("choices") or ():
        piece = choice.get("text")
        if piece is None:
            piece = (choice.get("delta") or {}).get("content")
        if piece is not None:  # an empty piece still marks a step (an incomplete UTF-8 char)
            # vLLM sends a chat's role chunk with the first output step, after the prefill.
            generation.text += piece
            generation.chunks += 1
            if generation.first_token_ts is None:
                generation.first_token_ts = now
            generation.last_token_ts = now
        if choice.get("finish_reason"):
            generation.finish_reason = choice["finish_reason"]
    usage = event.get("usage")
    if usage:
        generation.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        generation.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        generation.cached_tokens = int(details.get("cached_tokens") or 0)


async def _sse_lines(response: aiohttp.ClientResponse) -> Any:
    """The ``data:`` payloads of a server-sent-event stream."""
    async for line in response.content:
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()
