"""``tokenfleet gateway``: an OpenAI-compatible front door that schedules real engines.

For each ``/v1/chat/completions`` or ``/v1/completions`` call: find the caller (``auth``: its
tenant comes from its API key, never from what it sets), parse (``openai_api``), count and hash
the prompt with the model's tokenizer (``infra/prompts.py``; a long prompt on a thread, so other
calls go on), ask the decider that owns the request for its decision, directly
(``deciders``: its counts and block hashes, ``reply="http"``: this gateway executes it; the
prompt itself stays here; the decider records the request and its decision on the log), proxy
the call to the chosen engine (``proxy``: always streamed from the engine, so the first token is
seen), stream or return the answer, and publish what happened: a ``ResponseStarted`` at the
first token (and one with ``prefill_leg`` where a prefill step on another instance ended:
``proxy``) and a ``Completion`` with TTFT / TPOT / E2E as timed here, from the moment the
call arrived. An engine that fails before anything reached the client (it died, refused the
call) costs an ``error`` attempt and the call is scheduled again as the next attempt, up to
``attempts`` (``retry_backoff_s`` times n apart); then 502; a decider lost before it answered
costs an attempt too, asked of the next decider. Admission rejects are HTTP 429
(``over_quota``) or 503, with ``Retry-After``. A call waits for a decider until
``decision_timeout_s`` (deciders restarting, a broker restart: ``gateway/deciders.py``); then
503 with ``Retry-After`` (``no_decider``: none could be reached; ``no_decision``: asked, no
final answer in time).

Every error is OpenAI's error JSON (``{"error": {"message", "type", "param", "code"}}``), named
by the client's fields; what only an operator should see (engine URLs, broker errors) goes to
the log. The SLO class comes from ``X-TokenFleet-SLO-Class``: an unknown class is 400, one the
caller's key does not allow 403. With API keys, a call that declares no class gets one its key
allows (the class the scheduler would give it if allowed, else the key's first). A call's
session (the calls of one user, which a replay sends one after another) is its
``X-TokenFleet-Session`` header, else the body's ``user``; the request carries it only as a hash
with the tenant (``openai_api.session_id``).

Each call has a request id (``request_ids``: the client's ``x-request-id`` when it can be one):
the id on the bus, in the log, in the ``x-request-id`` response header and in the answer's
``id`` (``chatcmpl-<id>``). Each call ends with one line on the ``gateway.access`` logger and
one count in ``gateway_requests_total`` by how it ended: ``ok``, ``error`` (the engine failed
mid-answer), ``client_closed`` (the client hung up: while waiting for the decision, during the
answer or as it ended; its engine connection is closed, which makes vLLM abort, and the attempt
is recorded ``aborted`` on the bus, also when the decision comes after the client left) or the
error's code (``invalid_api_key``, ``over_quota``, ...) or HTTP status. A hang-up is not an
error of the gateway: it leaves no traceback.

``/v1/models`` lists the inventory's models (to callers with a key, when keys are on),
``/health`` says the process answers (live), ``/ready`` whether calls can get decisions now
(its producer runs, its reader of the deciders' announcements is current and knows a live
decider), ``/metrics`` is Prometheus.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaProducer

from agents.affinity import HotPrefixes
from agents.handlers import Refused
from agents.policy.common.slo import DEFAULT_SLO_CLASSES, classify
from gateway.auth import Authenticator, Caller
from gateway.connections import ConnectionGuard, ConnectionLimits
from gateway.deciders import Asked, Deciders, NoDecider
from gateway.openai_api import ApiError, ClientCall, Kind, parse_body, rejection
from gateway.proxy import CLIENT_CLOSED, ClientGone, EngineProxy, NothingSent, send_json
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.request_ids import InFlight, RequestId, RequestIds
from infra import metrics
from infra.kafka.broker import deciders_group
from infra.kafka.clients import send_event, start_client
from infra.kafka.connection import KafkaConnection
from infra.prompts import PromptError, Prompts
from infra.vllm import outcome
from infra.vllm.inventory import Inventory
from infra.vllm.openai_http import Generation
from infra.vllm.outcome import Status
from schemas.events import Event, InferenceRequest, RoutingDecision
from schemas.topics import COMPLETIONS, TopicSpec
from streams.direct import ANNOUNCE_EVERY_S, Answer

log = logging.getLogger(__name__)
access = logging.getLogger("gateway.access")


@dataclass(frozen=True)
class GatewayOptions:
    decision_timeout_s: float = 30.0
    attempts: int = 4  # engine failures before anything was sent are tried again, up to this
    retry_backoff_s: float = 0.25
    engine_timeout_s: float = 600.0
    tenant_header: str = "X-TokenFleet-Tenant"
    slo_class_header: str = "X-TokenFleet-SLO-Class"
    session_header: str = "X-TokenFleet-Session"
    slo_classes: frozenset[str] = frozenset(DEFAULT_SLO_CLASSES)  # the classes a call may name
    max_body_bytes: int = 4 * 1024 * 1024
    app_id: str = "tokenfleet"  # the scheduler whose deciders this gateway asks (TOKENFLEET_APP_ID)
    # What one client may hold (gateway/connections.py; TOKENFLEET_GATEWAY_*): a request's
    # headers within header_timeout_s of its first byte, idle_timeout_s between calls, and
    # max_connections open at once.
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    max_connections: int = 10_000


@dataclass
class _Call:
    """One HTTP call: its id, who made it, how it ended (``status``: the metrics label)."""

    rid: RequestId
    path: str
    arrived: float = field(default_factory=time.monotonic)
    tenant: str = "-"
    key_name: str = ""
    user: str = ""
    status: str = "ok"
    http_status: int = 200
    attempt: int = 0  # the highest attempt asked of a decider (0: none)
    ignored: tuple[str, ...] = ()  # body fields the gateway does not use


class Gateway:
    def __init__(
        self,
        connection: KafkaConnection,
        inventory: Inventory,
        prompts: Prompts,
        options: GatewayOptions | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        self.connection = connection
        self.inventory = inventory
        self.prompts = prompts
        self.options = options or GatewayOptions()
        self.auth = auth or Authenticator.open()
        self.models = {i.model for i in inventory.instances}
        self.deciders = Deciders(connection, deciders_group(self.options.app_id))
        self.ids = RequestIds()
        self.hot_prefixes = HotPrefixes()
        self.proxy = EngineProxy(inventory, self.options.engine_timeout_s, self._publish_soon)
        self._producer: AIOKafkaProducer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=[_errors_as_json])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def probe_app(self) -> web.Application:
        """``/health``, ``/ready`` and ``/metrics`` alone, for a port of their own: a probe that
        must reach this process when several share the calls' port, and that no cap refuses."""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        if self.auth.mode == "open":
            log.warning(
                "gateway: %s; %s and the body's 'user' do not choose the tenant",
                self.auth.describe(),
                self.options.tenant_header,
            )
        else:
            log.info("gateway: callers are known by %s", self.auth.describe())
        await self.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def start(self) -> None:
        # What the gateway publishes (first tokens, completions) is on no call's path: 10 ms of
        # linger puts the events of concurrent calls in one produce request (fewer system calls).
        self._producer = await start_client(
            lambda: AIOKafkaProducer(**self.connection.client_options(), linger_ms=10), "gateway producer"
        )
        await self.deciders.start()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        await self.deciders.close()  # first: decisions still awaited for clients that left end now
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)
        if self._producer is not None:
            await self._producer.stop()
        if self._session is not None:
            await self._session.close()

    # -- handlers -----------------------------------------------------------------------------

    async def _models(self, http: web.Request) -> web.Response:
        try:
            self.auth.caller(http.headers)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status, headers=err.headers)
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "tokenfleet"} for m in sorted(self.models)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def _ready(self, _request: web.Request) -> web.Response:
        """200 when calls can get decisions now (the producer runs, the deciders' reader is
        current, a live decider is known), else 503; the body says which part is missing."""
        ok = self._producer is not None and self.deciders.ready
        body = {"ok": ok, "producer": self._producer is not None, **self.deciders.status()}
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    async def _chat(self, http: web.Request) -> web.StreamResponse:
        return await self._call("chat", http)

    async def _completion(self, http: web.Request) -> web.StreamResponse:
        return await self._call("completion", http)

    async def _call(self, kind: Kind, http: web.Request) -> web.StreamResponse:
        client_id = http.headers.get(REQUEST_ID_HEADER)
        try:
            rid = self.ids.assign(client_id)
        except InFlight:
            return await self._in_flight(http, RequestId(str(client_id), client_id))
        call = _Call(rid, http.path)
        response: web.StreamResponse = web.Response(status=499)  # what a client that left "gets"
        try:
            try:
                response = await self._serve(kind, http, call)
            except ApiError as err:
                call.status, call.http_status = err.code or str(err.status), err.status
                response = await send_json(http, call, err.body(), err.status, err.headers)
            except ClientGone:
                call.status = CLIENT_CLOSED
        except asyncio.CancelledError:  # the client hung up (aiohttp cancels its handler)
            call.status = CLIENT_CLOSED
            raise
        except Exception:
            log.exception("request %s failed", call.rid.id)
            call.status, call.http_status = "500", 500
            error = ApiError(500, "the gateway failed on this call", type="server_error")
            response = await send_json(http, call, error.body(), 500)
        finally:
            self._finish(call)
            self.ids.ended(call.rid, answered=call.status == "ok", last_attempt=call.attempt)
        return response

    async def _in_flight(self, http: web.Request, rid: RequestId) -> web.StreamResponse:
        """409 for a call whose ``x-request-id`` names a call still running here (a client's
        retry that came before its first try ended): retried after ``Retry-After``, it is the
        next attempt of the same call."""
        call = _Call(rid, http.path, status="request_in_progress", http_status=409)
        error = ApiError(
            409,
            f"a call with x-request-id {rid.id[:128]!r} is still running here; retry once it ended",
            code="request_in_progress",
            headers={"Retry-After": "1"},
        )
        try:
            return await send_json(http, call, error.body(), 409, error.headers)
        except ClientGone:
            call.status = CLIENT_CLOSED
            return web.Response(status=499)
        finally:
            self._finish(call)

    async def _serve(self, kind: Kind, http: web.Request, call: _Call) -> web.StreamResponse:
        caller = self.auth.caller(http.headers)
        call.tenant, call.key_name = caller.tenant, caller.key_name
        declared = self._declared_class(http, caller)
        body = await self._read_json(http)
        session = http.headers.get(self.options.session_header, "")
        request, client = parse_body(kind, body, call.rid.id, caller.tenant, declared, self.models, session)
        call.user, call.ignored = client.user[:256], client.ignored
        request = request.model_copy(update={"attempt": call.rid.first_attempt})
        try:
            request = await self.prompts.complete_off_loop(request)
        except PromptError as exc:
            raise self._prompt_error(request, client, exc) from None
        if caller.slo_classes is not None and declared is None:
            request = request.model_copy(update={"slo_class": _class_for(request, caller.slo_classes)})
        for attempt in range(1, self.options.attempts + 1):
            if attempt > 1:
                request = request.model_copy(update={"attempt": request.attempt + 1})
            request, decision = await self._decide(request, call)
            try:
                assert self._session is not None
                return await self.proxy.run(self._session, http, call, request, client, decision)
            except NothingSent as failed:
                # The engine failed before anything reached the client: ask the scheduler again
                # (a new attempt; by then the failed engine may be out of the candidates).
                if attempt == self.options.attempts:
                    log.warning("request %s attempt %d: %s; giving up", request.request_id, attempt, failed)
                    raise ApiError(
                        502, f"the engines failed {attempt} times before answering", type="engine_error"
                    ) from None
                log.info("request %s attempt %d: %s; trying again", request.request_id, attempt, failed)
                await asyncio.sleep(self.options.retry_backoff_s * attempt)
        raise AssertionError("unreachable")

    def _declared_class(self, http: web.Request, caller: Caller) -> str | None:
        header = self.options.slo_class_header
        declared = http.headers.get(header) or None
        if declared is None:
            return None
        if declared not in self.options.slo_classes:
            raise ApiError(
                400,
                f"unknown SLO class {declared[:64]!r} in {header}; known: "
                + ", ".join(sorted(self.options.slo_classes)),
                code="invalid_slo_class",
                param=header,
            )
        if not caller.may_use(declared):
            raise ApiError(
                403,
                f"tenant {caller.tenant!r} may not use the SLO class {declared!r}; its key allows "
                + ", ".join(caller.slo_classes or ()),
                type="permission_denied",
                code="slo_class_not_allowed",
                param=header,
            )
        return declared

    async def _read_json(self, http: web.Request) -> Any:
        try:
            raw = await http.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(
                413,
                f"the body is larger than {self.options.max_body_bytes} bytes",
                code="request_too_large",
            ) from None
        except ConnectionError:
            raise ClientGone from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                400, f"the body is not valid UTF-8 (byte {exc.start} of {len(raw)})", code="invalid_encoding"
            ) from None
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise ApiError(400, "the body is not valid JSON", code="invalid_json") from None

    def _prompt_error(self, request: InferenceRequest, client: ClientCall, exc: PromptError) -> ApiError:
        param = "messages" if client.kind == "chat" else "prompt"
        if str(exc).startswith("the prompt"):  # the client's prompt: empty or too long once tokenized
            return ApiError(400, f"invalid '{param}': {exc}", param=param)
        log.error("request %s: cannot count the prompt: %s", request.request_id, exc)
        return ApiError(500, f"the gateway cannot tokenize prompts of {request.model!r}", type="server_error")

    # -- scheduling ---------------------------------------------------------------------------

    async def _decide(
        self, request: InferenceRequest, http_call: _Call
    ) -> tuple[InferenceRequest, RoutingDecision]:
        """Ask the request's decider directly (``gateway/deciders.py``), the prompt left out
        (it stays with the gateway; the decider needs its counts and hashes). Returns the
        request as decided (a higher ``attempt`` if a decider was lost on the way) and its
        placement; a reject is raised as its HTTP error, no answer within
        ``decision_timeout_s`` is 503. ``http_call.attempt`` follows the attempts asked."""
        asked = request.model_copy(update={"prompt": None, "messages": None, "prompt_token_ids": None})
        call = Asked(self.hot_prefixes.place(asked, time.time()))  # a hot prefix: over every decider
        wait_s = self.options.decision_timeout_s
        try:
            answer = await self.deciders.decide(call, time.monotonic() + wait_s)
        except NoDecider as exc:
            log.warning("request %s: no decider within %g s: %s", request.request_id, wait_s, exc)
            raise ApiError(
                503,
                f"no scheduler could be reached within {wait_s:g} s; try again shortly",
                type="service_unavailable",
                code="no_decider",
                headers={"Retry-After": str(math.ceil(ANNOUNCE_EVERY_S))},
            ) from None
        except TimeoutError:  # asked, and no final answer in time (held, or the decider is stuck)
            self._settle_late(call, "timeout")
            raise ApiError(
                503,
                f"no scheduling decision within {wait_s:g} s",
                type="service_unavailable",
                code="no_decision",
                headers={"Retry-After": "1"},
            ) from None
        except asyncio.CancelledError:
            self._settle_late(call, "aborted")
            raise
        except Refused as exc:
            log.error("request %s: the scheduler refused it: %s", request.request_id, exc)
            raise ApiError(500, "the scheduler refused the request", type="server_error") from None
        finally:
            http_call.attempt = max(http_call.attempt, call.request.attempt)
        metrics.gateway_decision_seconds.observe(time.time() - request.ts)
        if not isinstance(answer, RoutingDecision):
            raise rejection(answer)
        return request.model_copy(update={"attempt": call.request.attempt}), answer

    def _settle_late(self, call: Asked, status: Status) -> None:
        """The answer for a call nobody waits for any more (the client left, or the wait timed
        out), if it was asked: if it places the request, the attempt is recorded as ended
        (``status``), so the scheduler does not count it running for ever."""
        if call.answer is not None:
            self._spawn(self._settled(call.answer, status))

    async def _settled(self, answer: asyncio.Future[Answer], status: Status) -> None:
        await asyncio.wait({answer}, timeout=self.options.decision_timeout_s)
        if not answer.done():
            answer.cancel()
            return
        decision = None if answer.cancelled() or answer.exception() else answer.result()
        if isinstance(decision, RoutingDecision):
            log.info(
                "request %s attempt %d: placed after its caller left", decision.request_id, decision.attempt
            )
            await self._publish(COMPLETIONS, outcome.completion(decision, Generation(), status, time.time()))

    def _finish(self, call: _Call) -> None:
        metrics.gateway_requests_total.labels(status=call.status).inc()
        rid = call.rid
        note = ""
        if rid.client_id is not None and rid.client_id != rid.id:
            note = f" (client x-request-id {rid.client_id[:160]!r} not used: {rid.why_not})"
        if rid.first_attempt > 1:
            note += f" (a retry of the call: from attempt {rid.first_attempt})"
        if call.ignored:
            note += f" (body fields ignored: {', '.join(call.ignored)[:400]})"
        access.info(
            "%s %s tenant=%s%s user=%r -> %d %s %.3fs%s",
            rid.id,
            call.path,
            call.tenant,
            f" key={call.key_name}" if call.key_name else "",
            call.user,
            499 if call.status == CLIENT_CLOSED else call.http_status,  # nginx's "client closed"
            call.status,
            time.monotonic() - call.arrived,
            note,
        )

    # -- publishing ---------------------------------------------------------------------------

    async def _publish(self, spec: TopicSpec, event: Event, wait: bool = False) -> None:
        assert self._producer is not None
        delivery = await send_event(self._producer, spec, event)
        if wait:
            await delivery
        else:
            self._spawn(delivery)

    def _publish_soon(self, spec: TopicSpec, event: Event) -> None:
        """Publish ``event`` without waiting, to its end even if the handler is cancelled."""
        self._spawn(self._publish(spec, event))

    def _spawn(self, awaitable: Any) -> None:
        """Run ``awaitable`` to its end even if the handler is cancelled (a client that left)."""
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def serve(
    gateway: Gateway,
    host: str,
    port: int,
    stop: asyncio.Event,
    reuse_port: bool = False,
    probe_port: int | None = None,
) -> None:
    """Serve until ``stop`` is set. A client disconnect cancels its handler (the abort path).
    What a client may hold is bounded by ``Gateway.options`` (``gateway/connections.py``): a
    request's headers within ``header_timeout_s`` of its first byte (else 408 and closed), a
    connection idle ``idle_timeout_s`` closed, at most ``max_connections`` served at once (one
    more is answered 503 and closed). ``port`` 0: any free port, the one chosen logged.
    ``reuse_port``: several gateway processes share ``port``
    (``SO_REUSEPORT``): one that dies takes only its own calls with it, the others take the new
    connections. ``probe_port``: the probes (``Gateway.probe_app``) on a port of this process's
    own as well."""
    options = gateway.options
    guard = ConnectionGuard(
        ConnectionLimits(options.header_timeout_s, options.idle_timeout_s, options.max_connections)
    )
    runner = guard.runner(gateway.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    listener = await guard.listen(runner, host, port, reuse_port)
    port = listener.sockets[0].getsockname()[1]  # the one chosen, for port 0
    log.info("gateway listening on http://%s:%d (%s)", host, port, guard.describe())
    probes = None
    if probe_port is not None:
        probes = web.AppRunner(gateway.probe_app(), access_log=None)
        await probes.setup()
        await web.TCPSite(probes, host, probe_port).start()
        log.info("gateway probes on http://%s:%d", host, probe_port)
    try:
        await stop.wait()
    finally:
        listener.close()  # no new connections; those open end with the runner
        if probes is not None:
            await probes.cleanup()
        await runner.cleanup()


def _class_for(request: InferenceRequest, allowed: tuple[str, ...]) -> str:
    """The class of a call that declared none, for a caller limited to ``allowed``: the one the
    scheduler would give it, if allowed, else the first allowed."""
    natural = classify(request.input_tokens, None)
    return natural if natural in allowed else allowed[0]


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own errors (unknown path, wrong method) as OpenAI's error JSON, not text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = ApiError(
            exc.status,
            f"{exc.reason}: {request.method} {request.path[:200]}",
            type="invalid_request_error" if exc.status < 500 else "server_error",
            code=re.sub(r"\W+", "_", exc.reason.lower()).strip("_") or None,
        )
        kept = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
        return web.json_response(error.body(), status=exc.status, headers=kept)
