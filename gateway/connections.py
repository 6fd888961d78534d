"""What one client may hold of the gateway: its connections' time and number.

Three bounds, all settings (``TOKENFLEET_GATEWAY_HEADER_TIMEOUT_S``, ``..._IDLE_TIMEOUT_S``,
``..._MAX_CONNECTIONS``):

- **Header timeout** (``header_timeout_s``): a request's line and headers must all have arrived
  within ``header_timeout_s`` of the request's first byte. Else the gateway answers
  ``408 request_timeout`` (OpenAI's error JSON, ``Connection: close``) and closes: a client
  trickling headers (slowloris) holds a connection that long at most.
- **Idle timeout** (``idle_timeout_s``): a connection with no call in progress closes
  ``idle_timeout_s`` after it opened or after its previous call ended (handler returned and
  its body read), unless a whole request's headers arrived by then. This is aiohttp's own
  keep-alive timeout (``RequestHandler(keepalive_timeout=)``: armed when the connection opens
  and after each response; it closes the connection if the handler still waits for a whole
  request), used as it is; ``tests/unit/gateway/test_connections.py`` pins that behaviour.
  So a request's headers are bounded by the earlier of the two deadlines: first byte +
  ``header_timeout_s`` and idle start + ``idle_timeout_s``. A client sees its pooled
  connection closed (FIN, no answer), as every HTTP client expects of a keep-alive connection.
- **Cap** (``max_connections``): at most that many client connections are served at once. A
  connection accepted beyond it is answered at once, before its request is parsed, with
  ``503 too_many_connections`` (OpenAI's error JSON, ``Retry-After: 1``,
  ``Connection: close``) and closed as soon as the client closes (``REFUSAL_GRACE_S`` at
  most; what it sends meanwhile is dropped, so the 503 is not lost to a reset); the
  connections already open are served as before. OpenAI's clients retry a 503. Beyond
  ``MAX_REFUSING`` refusals at once the rest are closed at once (their client may see a reset,
  which it retries too). The cap holds only if the process may open the files it needs:
  ``fit_to_fd_limit`` raises the soft ``RLIMIT_NOFILE`` towards the hard one (as Go's runtime
  does at start) and lowers the cap to ``(soft limit - RESERVED_FDS) // FDS_PER_CONNECTION``
  when even the hard limit is short: beyond the limit ``accept`` fails and the calls in
  progress could not reach an engine.

Defaults, and why (``infra/settings.py`` holds them, ``GatewayOptions`` repeats them; a test
keeps the two equal):
``header_timeout_s`` 10 s: an API client sends its headers in one write; 10 s outlasts three
retransmissions of a lost segment (1 + 2 + 4 s from the initial 1 s RTO), while nginx's
``client_header_timeout`` and Node's ``headersTimeout`` (60 s) let each slowloris connection
live six times longer. ``idle_timeout_s`` 75 s: nginx's ``keepalive_timeout``; longer than the
usual load balancer's idle timeout (60 s on AWS ALB), so a balancer's pooled connection is
closed by the balancer, not by the gateway as the balancer reuses it (the 502s behind uvicorn's
5 s), and far below Envoy's 1 h that holds a file for nothing. ``max_connections`` 10 000: the
per-listener ``connection_limit`` of Envoy's edge-proxy best practices (Envoy itself and
uvicorn's ``limit_concurrency`` have no default); every call holds its connection for its whole
answer, so the cap must sit well above the calls a replica streams at once.

What a connection becomes is counted in ``tokenfleet_gateway_connections_cut_total`` by reason
(``header_timeout``, ``idle``, ``over_cap``; a cut is ``idle`` when nothing of a next request
had arrived, ``header_timeout`` when part of it had) and ``tokenfleet_gateway_connections_open``
is the number served now. Closes of the client's doing, a ``Connection: close`` call and
shutdown are not cuts.

How: each accepted connection's protocol is ``_Guarded``, which admits it or refuses it, then
hands every event to the aiohttp ``RequestHandler`` that serves it (built by the runner's own
``Server``, the protocol factory ``web.TCPSite`` would use) and watches: the first byte while
idle arms the header timer; the middleware (``ConnectionGuard.runner`` puts it outermost) says
when a request's headers were parsed (its handler starts: the timer stops) and when the call
ended (the handler returned and ``request.content`` reached its end). Bytes that arrive while a
call runs (pipelining) do not arm the header timer: the idle deadline still bounds them.
Not bounded here: a slow request body (the handler's read), a client that reads its answer
slowly.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from infra import metrics

log = logging.getLogger(__name__)

FDS_PER_CONNECTION = 2  # the client's socket and, while its call runs, the engine's
RESERVED_FDS = 256  # the broker's clients, the direct lanes, tokenizer files, logs, refusals
REFUSAL_GRACE_S = 1.0  # a refused client's request is read (and dropped) this long at most
MAX_REFUSING = 64  # refused connections in their grace at once; more are closed at once
LISTEN_BACKLOG = 2048  # uvicorn's and gunicorn's: a burst of connects is not made to wait a SYN retry


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    idle_timeout_s: float
    max_connections: int


def fit_to_fd_limit(max_connections: int, soft: int, hard: int) -> tuple[int, int]:
    """``(cap, soft limit to set)`` for a process whose ``RLIMIT_NOFILE`` is ``(soft, hard)``:
    needed = ``max_connections * FDS_PER_CONNECTION + RESERVED_FDS``; the soft limit rises to
    ``min(needed, hard)`` if below (``hard`` < 0 is unlimited), never falls; the cap is
    ``min(max_connections, (new soft - RESERVED_FDS) // FDS_PER_CONNECTION)``, at least 1."""
    needed = max_connections * FDS_PER_CONNECTION + RESERVED_FDS
    new_soft = soft
    if 0 <= soft < needed:
        new_soft = needed if hard < 0 else max(soft, min(needed, hard))
    room = max_connections if new_soft < 0 else (new_soft - RESERVED_FDS) // FDS_PER_CONNECTION
    return max(1, min(max_connections, room)), new_soft


def _raise_fd_limit(max_connections: int) -> int:
    """Apply ``fit_to_fd_limit`` to this process; the cap it allows (a warning if lowered)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap, new_soft = fit_to_fd_limit(max_connections, soft, hard)
    if new_soft != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        log.info("gateway: open-file limit raised from %d to %d for %d connections", soft, new_soft, cap)
    if cap < max_connections:
        log.warning(
            "gateway: at most %d connections, not %d: the open-file limit is %d (hard %d); "
            "raise it (ulimit -n, LimitNOFILE) for more",
            cap,
            max_connections,
            new_soft,
            hard,
        )
    return cap


def _http_error(status: str, type_: str, code: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 answer with OpenAI's error JSON, closing the connection."""
    error = {"message": message, "type": type_, "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body


class _State(enum.Enum):
    IDLE = "idle"  # between calls: nothing of a next request yet
    HEADERS = "headers"  # part of a request arrived, its headers are not complete
    BUSY = "busy"  # a call runs (its handler, or its body still arriving)


class _Guarded(asyncio.Protocol):
    """One client connection: refused over the cap, else served by aiohttp's ``inner`` with
    the header timer around it (the module's docstring)."""

    def __init__(self, guard: ConnectionGuard, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.make_inner = make_inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.state = _State.IDLE
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.client_closed = False
        self.cut = False
        self._handler_done = self._body_done = True

    # -- the transport's events -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.guard.admit(self):
            self._refuse(transport)
            return
        self.idle_since = self.guard.loop.time()
        self.inner = self.make_inner()
        self.guard.handlers[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None or self.cut:
            return  # a refused client's request, or bytes after a cut: dropped
        if self.state is _State.IDLE and data:
            self.state = _State.HEADERS
            self.timer = self.guard.loop.call_later(self.guard.limits.header_timeout_s, self._headers_late)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        self.client_closed = True
        return None if self.inner is None else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self.inner is None:
            self.guard.refusing.discard(self)
            return
        self.guard.closed(self, self._cut_by_idle_deadline(exc))
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # -- what the middleware says -------------------------------------------------------------

    def call_started(self, request: web.BaseRequest) -> None:
        """The request's headers are parsed and its handler starts."""
        self._stop_timer()
        self.state = _State.BUSY
        self._handler_done = self._body_done = False
        request.content.on_eof(self._body_ended)  # at once if it has no body or it is all here

    def call_ended(self) -> None:
        """The request's handler returned (or was cancelled)."""
        self._handler_done = True
        self._maybe_idle()

    def _body_ended(self) -> None:
        self._body_done = True
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self._handler_done and self._body_done and self.state is _State.BUSY:
            self.state = _State.IDLE
            self.idle_since = self.guard.loop.time()

    # -- cuts ---------------------------------------------------------------------------------

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 and end the sending side (the client reads the answer, then the end).
        The socket is closed when the client closes it (``REFUSAL_GRACE_S`` at most), its
        request read and dropped meanwhile: a socket closed with unread bytes is reset, and the
        reset could reach the client before the 503. Beyond ``MAX_REFUSING`` refusals in their
        grace, closed at once (a flood holds no more files)."""
        transport.write(self.guard.refusal)
        if len(self.guard.refusing) >= MAX_REFUSING or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.guard.refusing.add(self)
        self.timer = self.guard.loop.call_later(REFUSAL_GRACE_S, transport.abort)

    def _headers_late(self) -> None:
        self.timer = None
        if self.state is not _State.HEADERS or self.transport is None or self.cut:
            return
        self.cut = True
        metrics.gateway_connections_cut.labels(reason="header_timeout").inc()
        self.transport.write(self.guard.header_timeout_answer)
        self.transport.close()

    def _cut_by_idle_deadline(self, exc: Exception | None) -> bool:
        """Whether aiohttp's keep-alive timeout closed this connection: the gateway closed it
        (no error, the client had not closed its side) while no call ran, and the idle deadline
        had passed (aiohttp's deadline starts after ours: as the response is written)."""
        if self.cut or exc is not None or self.client_closed or self.state is _State.BUSY:
            return False
        return self.guard.loop.time() >= self.idle_since + self.guard.limits.idle_timeout_s

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ConnectionGuard:
    """The bounds of ``limits`` on one gateway's listener: ``runner`` builds the aiohttp runner
    that applies the idle timeout and tells the guard of each call, ``listen`` accepts
    connections through the guard. ``open``: connections served now."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.max_connections = _raise_fd_limit(limits.max_connections)
        self.open = 0
        self.handlers: dict[object, _Guarded] = {}  # aiohttp's handler -> its connection
        self.refusing: set[_Guarded] = set()  # refused, in their grace
        self.refusal = _http_error(
            "503 Service Unavailable",
            "service_unavailable",
            "too_many_connections",
            f"the gateway serves {self.max_connections} connections at most; try again shortly",
            "Retry-After: 1\r\n",
        )
        self.header_timeout_answer = _http_error(
            "408 Request Timeout",
            "invalid_request_error",
            "request_timeout",
            f"the request's headers did not arrive within {limits.header_timeout_s:g} s",
        )

    def runner(self, app: web.Application, **kwargs: Any) -> web.AppRunner:
        """An ``AppRunner`` for ``app`` (``kwargs`` as ``AppRunner``'s) with the idle timeout
        and the guard's middleware, outermost (it sees every call the app sees)."""
        app.middlewares.insert(0, self._middleware())
        return web.AppRunner(app, keepalive_timeout=self.limits.idle_timeout_s, **kwargs)

    async def listen(
        self, runner: web.AppRunner, host: str, port: int, reuse_port: bool = False
    ) -> asyncio.Server:
        """Accept connections on ``host``:``port`` for ``runner`` (set up), through the guard;
        ``reuse_port``: share the port with other processes that set it too (``SO_REUSEPORT``:
        the kernel spreads new connections over them). Close the returned server before
        ``runner.cleanup()``."""
        server = runner.server
        assert server is not None, "runner.setup() first"
        return await self.loop.create_server(
            lambda: _Guarded(self, server),
            host,
            port,
            backlog=LISTEN_BACKLOG,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )

    def describe(self) -> str:
        return (
            f"headers within {self.limits.header_timeout_s:g} s, idle connections closed after "
            f"{self.limits.idle_timeout_s:g} s, at most {self.max_connections} connections"
        )

    def admit(self, conn: _Guarded) -> bool:
        if self.open >= self.max_connections:
            metrics.gateway_connections_cut.labels(reason="over_cap").inc()
            return False
        self.open += 1
        metrics.gateway_connections_open.inc()
        return True

    def closed(self, conn: _Guarded, idle_cut: bool) -> None:
        self.open -= 1
        metrics.gateway_connections_open.dec()
        self.handlers.pop(conn.inner, None)
        if idle_cut:
            reason = "idle" if conn.state is _State.IDLE else "header_timeout"
            metrics.gateway_connections_cut.labels(reason=reason).inc()

    def _middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        guard = self

        @web.middleware
        async def track_calls(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            conn = guard.handlers.get(request.protocol)
            if conn is None:
                return await handler(request)
            conn.call_started(request)
            try:
                return await handler(request)
            finally:
                conn.call_ended()

        return track_calls
