"""The emulated instance's HTTP server: vLLM's OpenAI endpoints, ``/health``, ``/metrics``, and the
lab's ``/debug/served`` (the package docstring states what each answers).

``EmulatedServer`` reads a call's body as the gateway reads a client's (``parse_body``),
tokenizes its prompt (``PromptTokenizer``, on a worker thread so long prompts do not stall the
streams), queues it on the engine and answers from the engine's progress: streamed as it
comes, or whole at its end. aiohttp cancels the handler of a client that disconnects; the call
is then aborted on the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from agents.prompt_blocks import chained_block_hashes
from gateway.openai_api import ApiError, ClientCall, Kind, assembled, parse_body
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.request_ids import RequestId
from infra.prompts import PromptError, PromptTokenizer
from infra.vllm.openai_http import Generation
from local.emulated_vllm import answers
from local.emulated_vllm.engine import Call, EmulatedEngine
from local.emulated_vllm.kv_events import KvPublisher
from local.emulated_vllm.metrics import render
from schemas.events import InferenceRequest

_TENANT = "emulated"  # parse_body's tenant: an engine has none
_BODY_REQUEST_ID = "request_id"  # vLLM's body field naming the call, when no header does


class EmulatedServer:
    """Serves ``engine`` as ``served_model_name``; ``kv`` publishes its cache changes (None:
    none published, as a vLLM without ``--kv-events-config``)."""

    def __init__(
        self,
        engine: EmulatedEngine,
        tokenizer: PromptTokenizer,
        served_model_name: str,
        kv: KvPublisher | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = served_model_name
        self.kv = kv
        self.served: Counter[str] = Counter()  # request id -> calls queued with it
        self.created = int(time.time())
        if kv is not None:
            engine.on_cache_changes = kv.publish
            engine.on_call_ended = self._call_ended

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completion)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/debug/served", self.debug_served)
        return app

    async def chat(self, http: web.Request) -> web.StreamResponse:
        return await self._generate(http, "chat")

    async def completion(self, http: web.Request) -> web.StreamResponse:
        return await self._generate(http, "completion")

    async def models(self, _http: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, _http: web.Request) -> web.Response:
        return web.Response()

    async def metrics(self, _http: web.Request) -> web.Response:
        return web.Response(
            body=render(self.engine.load(), self.model), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def debug_served(self, _http: web.Request) -> web.Response:
        return web.json_response({"requests": dict(self.served)})

    # -- one call -------------------------------------------------------------------------------

    async def _generate(self, http: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            request, client, prompt_ids = await self._read(http, kind)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        length, finish_reason = answers.answer_length(
            prompt_ids, request.output_budget, request.sampling.ignore_eos
        )
        if self.kv is not None:
            self.kv.blocks.hold(request.prompt_block_hashes, prompt_ids)
        call = self.engine.start(request, length)
        self.served[request.request_id] += 1
        answer = _Answer(
            client, RequestId(request.request_id).response_id(kind), len(prompt_ids), finish_reason
        )
        try:
            if client.stream:
                return await answer.stream(http, call)
            return await answer.whole(call)
        except (asyncio.CancelledError, ConnectionError):  # the client left: vLLM aborts the call
            self.engine.abort(call)
            raise

    async def _read(self, http: web.Request, kind: Kind) -> tuple[InferenceRequest, ClientCall, list[int]]:
        """The call's request (its prompt counted and hashed), what the client asked for, and
        the prompt's token ids; ``ApiError`` for a call vLLM would refuse."""
        try:
            body: Any = json.loads(await http.read())
        except ValueError:  # not JSON, or not UTF-8
            raise ApiError(400, "the body is not valid JSON", code="invalid_body") from None
        request_id = http.headers.get(REQUEST_ID_HEADER)
        if isinstance(body, dict):
            in_body = body.pop(_BODY_REQUEST_ID, None)  # vLLM's own field: not the gateway's to read
            request_id = request_id or (in_body if isinstance(in_body, str) and in_body else None)
        request, client = parse_body(
            kind, body, request_id or uuid.uuid4().hex, _TENANT, None, known_models={self.model}
        )
        try:
            prompt_ids = await asyncio.to_thread(self.tokenizer.token_ids, request)
        except PromptError as exc:
            raise ApiError(400, str(exc), param="messages" if kind == "chat" else "prompt") from None
        wanted = len(prompt_ids) + request.output_budget
        if not prompt_ids or wanted > self.engine.max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.engine.max_model_len} tokens. However, "
                f"you requested {wanted} tokens ({len(prompt_ids)} in the prompt, {request.output_budget} "
                "in the completion). Please reduce the length of the prompt or completion.",
                param="max_tokens",
            )
        hashes = chained_block_hashes(prompt_ids)
        request = request.model_copy(update={"input_tokens": len(prompt_ids), "prompt_block_hashes": hashes})
        return request, client, prompt_ids

    def _call_ended(self, call: Call) -> None:
        assert self.kv is not None
        self.kv.blocks.let_go(call.prompt_blocks)


class _Answer:
    """How one call is answered: its shape (``client``), id, prompt size and finish reason."""

    def __init__(self, client: ClientCall, response_id: str, prompt_tokens: int, finish_reason: str) -> None:
        self.client = client
        self.response_id = response_id
        self.prompt_tokens = prompt_tokens
        self.finish_reason = finish_reason
        self.created = int(time.time())

    async def whole(self, call: Call) -> web.Response:
        """The non-streamed answer, once the call ended."""
        while call.ended is None:
            await call.changed.wait()
            call.changed.clear()
        ended = call.ended
        if ended.status != "ok":
            error = _engine_error(ended.status)
            return web.json_response(error.body(), status=error.status)
        generation = Generation(
            text=answers.token_text(0, ended.output_tokens),
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=ended.output_tokens,
            cached_tokens=ended.cached_tokens,
        )
        return web.json_response(assembled(self.client, self.response_id, generation))

    async def stream(self, http: web.Request, call: Call) -> web.StreamResponse:
        """Stream the call's tokens as the engine generates them, then its end."""
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(http)
        kind, model = self.client.kind, self.client.client_model
        sent = 0
        while True:
            await call.changed.wait()
            call.changed.clear()
            ended = call.ended
            if ended is not None and ended.status != "ok":
                await _event(stream, _engine_error(ended.status).body())
                break
            if call.tokens > sent or ended is not None:
                if sent == 0 and kind == "chat":
                    await _event(
                        stream, answers.chunk(kind, self.response_id, model, self.created, "", role=True)
                    )
                text = answers.token_text(sent, call.tokens)
                finish = self.finish_reason if ended is not None else None
                await _event(stream, answers.chunk(kind, self.response_id, model, self.created, text, finish))
                sent = call.tokens
            if ended is not None:
                if self.client.include_usage:
                    usage = answers.usage(self.prompt_tokens, ended.output_tokens, ended.cached_tokens)
                    await _event(
                        stream, answers.usage_chunk(kind, self.response_id, model, self.created, usage)
                    )
                break
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


def _engine_error(status: str) -> ApiError:
    """A call the engine ended otherwise than ``ok`` (only one refused as too long can be)."""
    return ApiError(500, f"the engine ended the request: {status}", type="InternalServerError")


async def _event(stream: web.StreamResponse, payload: dict[str, Any]) -> None:
    await stream.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
