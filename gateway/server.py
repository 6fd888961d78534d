"""``tokenfleet gateway``: an OpenAI-compatible front door that schedules real engines.

For each ``/v1/chat/completions`` or ``/v1/completions`` call: parse (``openai_api``), count and
hash the prompt with the model's tokenizer (``infra/prompts.py``), publish the request to
``tf.requests`` (``reply="http"``: this gateway executes it; the prompt itself stays here, the
bus carries its counts and block hashes), wait for the scheduler's answer (``decisions``),
proxy the call to the chosen engine (always streamed from the engine, so the first token is
seen), stream or return the answer, and publish what happened: a ``ResponseStarted`` at the
first token and a ``Completion`` with TTFT / TPOT / E2E as measured here, from the moment the
call arrived. A client that disconnects aborts the generation at the engine (the connection to
it is closed) and is recorded ``aborted``. An engine that fails before anything reached the
client (it died, refused the call) costs an ``error`` attempt and the call is scheduled again as
the next attempt, up to ``attempts`` (``retry_backoff_s`` times n apart); then 502. Admission
rejects are HTTP 429 (``over_quota``) or 503, with ``Retry-After``; no answer within
``decision_timeout_s`` is 503.

``/v1/models`` lists the inventory's models, ``/health`` says whether the broker link works,
``/metrics`` is Prometheus.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaProducer

from gateway.decisions import DecisionWaiter
from gateway.openai_api import ApiError, ClientCall, Kind, assembled, parse_body, rejection
from infra import metrics
from infra.kafka.clients import send_event, start_client
from infra.prompts import PromptError, Prompts
from infra.vllm import outcome
from infra.vllm.inventory import Inventory
from infra.vllm.openai_http import EngineHttpError, Generation, engine_call, stream_generation
from infra.vllm.outcome import Status
from schemas.events import Event, InferenceRequest, RoutingDecision
from schemas.topics import COMPLETIONS, FIRST_TOKENS, REQUESTS, TopicSpec

log = logging.getLogger(__name__)


class _NothingSent(RuntimeError):
    """The engine failed before any byte of the answer reached the client."""


@dataclass(frozen=True)
class GatewayOptions:
    decision_timeout_s: float = 30.0
    attempts: int = 4  # engine failures before anything was sent are tried again, up to this
    retry_backoff_s: float = 0.25
    engine_timeout_s: float = 600.0
    tenant_header: str = "X-TokenFleet-Tenant"
    slo_class_header: str = "X-TokenFleet-SLO-Class"


class Gateway:
    def __init__(
        self, bootstrap: str, inventory: Inventory, prompts: Prompts, options: GatewayOptions | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.inventory = inventory
        self.prompts = prompts
        self.options = options or GatewayOptions()
        self.models = {i.model for i in inventory.instances}
        self.waiter = DecisionWaiter(bootstrap)
        self._producer: AIOKafkaProducer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._ids = 0
        self._prefix = f"gw-{os.getpid()}-{int(time.time() * 1000) % 10**9}"

    # -- lifecycle ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def start(self) -> None:
        self._producer = await start_client(
            lambda: AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=0), "gateway producer"
        )
        await self.waiter.start()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)
        await self.waiter.close()
        if self._producer is not None:
            await self._producer.stop()
        if self._session is not None:
            await self._session.close()

    # -- handlers -----------------------------------------------------------------------------

    async def _models(self, _request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "tokenfleet"} for m in sorted(self.models)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, _request: web.Request) -> web.Response:
        ok = self._producer is not None and self.waiter.running
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    async def _chat(self, http: web.Request) -> web.StreamResponse:
        return await self._call("chat", http)

    async def _completion(self, http: web.Request) -> web.StreamResponse:
        return await self._call("completion", http)

    async def _call(self, kind: Kind, http: web.Request) -> web.StreamResponse:
        try:
            return await self._serve(kind, http)
        except ApiError as err:
            metrics.gateway_requests_total.labels(status=err.code or str(err.status)).inc()
            return web.json_response(err.body(), status=err.status, headers=err.headers)

    async def _serve(self, kind: Kind, http: web.Request) -> web.StreamResponse:
        try:
            body = await http.json()
        except ValueError:
            raise ApiError(400, "the body is not valid JSON") from None
        self._ids += 1
        request_id = f"{self._prefix}-{self._ids}"
        tenant = http.headers.get(self.options.tenant_header) or str(body.get("user") or "default")
        slo_class = http.headers.get(self.options.slo_class_header) or None
        request, call = parse_body(kind, body, request_id, tenant[:256], slo_class, self.models)
        try:
            request = self.prompts.complete(request)
        except PromptError as exc:
            raise ApiError(400, str(exc)) from None
        for attempt in range(1, self.options.attempts + 1):
            if attempt > 1:
                request = request.model_copy(update={"attempt": attempt})
            decision = await self._decide(request)
            try:
                return await self._proxy(http, request, call, decision)
            except _NothingSent as failed:
                # The engine failed before anything reached the client: ask the scheduler again
                # (a new attempt; by then the failed engine may be out of the candidates).
                if attempt == self.options.attempts:
                    raise ApiError(502, str(failed), type="engine_error") from None
                log.info("request %s attempt %d: %s; trying again", request.request_id, attempt, failed)
                await asyncio.sleep(self.options.retry_backoff_s * attempt)
        raise AssertionError("unreachable")

    # -- scheduling ---------------------------------------------------------------------------

    async def _decide(self, request: InferenceRequest) -> RoutingDecision:
        key = (request.request_id, request.attempt)
        answer_future = self.waiter.expect(key)
        # The bus carries counts and hashes, not the prompt: it stays with the gateway.
        on_bus = request.model_copy(update={"prompt": None, "messages": None, "prompt_token_ids": None})
        try:
            await self._publish(REQUESTS, on_bus, wait=True)
        except Exception as exc:
            self.waiter.forget(key)
            raise ApiError(
                503, f"the scheduler's broker is unavailable: {exc}", type="service_unavailable"
            ) from None
        try:
            answer = await asyncio.wait_for(answer_future, self.options.decision_timeout_s)
        except TimeoutError:
            self.waiter.forget(key)
            raise ApiError(
                503,
                f"no scheduling decision within {self.options.decision_timeout_s:g} s",
                type="service_unavailable",
                code="no_decision",
            ) from None
        metrics.gateway_decision_seconds.observe(time.time() - request.ts)
        if not isinstance(answer, RoutingDecision):
            raise rejection(answer)
        return answer

    async def _proxy(
        self, http: web.Request, request: InferenceRequest, call: ClientCall, decision: RoutingDecision
    ) -> web.StreamResponse:
        entry = self.inventory.instance(decision.instance_id)
        if entry is None:
            raise ApiError(
                502, f"the scheduler chose {decision.instance_id!r}, not in this gateway's inventory"
            )
        path, body = engine_call(request, entry.served_model_name or entry.model)
        generation = Generation()
        stream: web.StreamResponse | None = None
        started = False

        async def on_event(event: dict[str, Any], raw: bytes) -> None:
            nonlocal stream, started
            if event.get("choices") and not started:
                started = True
                self._spawn(self._publish(FIRST_TOKENS, outcome.first_token(decision, time.time())))
            if not call.stream:
                return
            if not event.get("choices") and not call.include_usage:
                return
            if stream is None:
                stream = await self._open_stream(http)
            event["model"] = call.client_model
            await stream.write(b"data: " + json.dumps(event).encode() + b"\n\n")

        status: Status = "error"
        try:
            assert self._session is not None
            await stream_generation(
                self._session, entry.url, path, body, on_event, self.options.engine_timeout_s, into=generation
            )
            status = "ok"
        except asyncio.CancelledError:
            status = "aborted"  # the client hung up: leaving closes the engine connection
            raise
        except (EngineHttpError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            if (
                isinstance(exc, ConnectionResetError | aiohttp.ClientConnectionResetError)
                and stream is not None
            ):
                status = "aborted"  # writing to a client that left
                raise asyncio.CancelledError from exc
            if stream is None:
                if isinstance(exc, EngineHttpError) and 400 <= exc.status < 500:
                    # The engine refused the call itself (e.g. a prompt beyond its context): so
                    # would any other; the client gets the engine's answer, not a retry.
                    raise ApiError(exc.status, f"the engine refused the request: {exc}") from None
                raise _NothingSent(f"the engine {entry.instance_id} failed: {exc}") from None
            await stream.write(b"data: " + json.dumps({"error": {"message": str(exc)}}).encode() + b"\n\n")
            return stream
        finally:
            metrics.gateway_requests_total.labels(status=status).inc()
            self._spawn(
                self._publish(COMPLETIONS, outcome.completion(decision, generation, status, time.time()))
            )
        if not call.stream:
            return web.json_response(assembled(call, request.request_id, generation))
        if stream is None:
            stream = await self._open_stream(http)
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream

    async def _open_stream(self, http: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(http)
        return stream

    # -- publishing ---------------------------------------------------------------------------

    async def _publish(self, spec: TopicSpec, event: Event, wait: bool = False) -> None:
        assert self._producer is not None
        delivery = await send_event(self._producer, spec, event)
        if wait:
            await delivery
        else:
            self._spawn(delivery)

    def _spawn(self, awaitable: Any) -> None:
        """Run ``awaitable`` to its end even if the handler is cancelled (a client that left)."""
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def serve(gateway: Gateway, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set. A client disconnect cancels its handler (the abort path)."""
    runner = web.AppRunner(gateway.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("gateway listening on http://%s:%d", host, port)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
