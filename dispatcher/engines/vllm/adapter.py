"""The engine port over real vLLM servers: HTTP for generation, ``/metrics`` for load, ZMQ for KV.

``VllmEngines`` implements ``dispatcher.engines.port.EnginePort`` for the instances of an inventory
(``infra/vllm/inventory.py``):

- ``dispatch`` starts one streamed generation per attempt (``openai_http``), in its own task;
  its first token becomes a ``ResponseStarted``, its end a ``Response`` (the text) and a
  ``Completion`` (TTFT, TPOT and E2E as this dispatcher timed them, from the request's
  ``ts``). A request past its ``deadline_ts`` times out (``timeout``); ``abort`` closes the
  connection, which makes vLLM abort it (``aborted``); an engine that refuses or breaks the
  stream gives ``error``.
- ``load`` reports what the scrapers last read: every ``scrape_s`` each instance's ``/health``
  and ``/metrics`` (``dispatcher/engines/vllm/metrics.py`` documents each heartbeat field's source);
  ``tokens_in_flight`` is this dispatcher's own count (prompt plus streamed tokens of its open
  attempts there; the service adds the requests gateways run there, ``dispatcher/elsewhere.py``).
  An instance that does not answer a scrape within ``scrape_s`` is reported not ready at once,
  so it leaves the candidates within two scrape intervals of going silent.
- ``events`` also returns the instances' KV-cache changes (``kv_events.KvEventSubscriber``),
  mapped onto TokenFleet's 512-token prefix blocks.

Background tasks (scrapers, generations) start at the first call, in the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import aiohttp

from dispatcher.engines.port import Endpoint, EngineError, EngineEvent
from dispatcher.engines.vllm.kv_events import KvEventSubscriber
from dispatcher.engines.vllm.metrics import EngineMetrics, heartbeat_fields, parse_metrics
from infra.errors import first_line
from infra.vllm import outcome
from infra.vllm.inventory import InstanceEntry, Inventory
from infra.vllm.openai_http import (
    EngineHttpError,
    Generation,
    engine_call,
    engine_request_id,
    stream_generation,
)
from infra.vllm.outcome import Status
from schemas.events import Heartbeat, RoutingDecision

log = logging.getLogger(__name__)

_REMEMBERED_ATTEMPTS = 100_000  # redeliveries come soon after the original: a bounded memory
_DEFAULT_TIMEOUT_S = 600.0  # a generation with no deadline gives up after this
_NO_METRICS = {
    "waiting": 0,
    "running": 0,
    "tokens_in_flight": 0,
    "kv_blocks_used": 0,
    "kv_blocks_total": 1,
}


@dataclass
class _Attempt:
    decision: RoutingDecision
    entry: InstanceEntry
    task: asyncio.Task[None] | None = None
    streamed: int = 0  # output chunks so far
    aborted: bool = False


@dataclass
class _Scraped:
    """An instance's last scrape."""

    ready: bool = False
    metrics: EngineMetrics | None = None
    ts: float = 0.0


class VllmEngines:
    """``EnginePort`` over the instances of ``inventory`` (see the module docstring)."""

    def __init__(
        self,
        inventory: Inventory,
        scrape_s: float = 0.5,
        kv_events: bool = True,
        request_timeout_s: float = _DEFAULT_TIMEOUT_S,
    ) -> None:
        if scrape_s <= 0:
            raise ValueError("scrape_s must be > 0")
        self.inventory = inventory
        self.scrape_s = scrape_s
        self.request_timeout_s = request_timeout_s
        self._endpoints = tuple(
            Endpoint(i.instance_id, i.dc, i.model, i.version, "vllm") for i in inventory.instances
        )
        self._entries = {i.instance_id: i for i in inventory.instances}
        self._scraped = {i.instance_id: _Scraped() for i in inventory.instances}
        self._open: dict[tuple[str, int], _Attempt] = {}
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._outbox: list[EngineEvent] = []
        self._subscribers = (
            [
                KvEventSubscriber(i.instance_id, i.model, i.kv_events, i.kv_replay)
                for i in inventory.instances
                if i.kv_events is not None
            ]
            if kv_events
            else []
        )
        self._session: aiohttp.ClientSession | None = None
        self._scrapers: list[asyncio.Task[None]] = []
        self._closed = False

    # -- the port -----------------------------------------------------------------------------

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    @property
    def open_requests(self) -> int:
        return len(self._open)

    async def dispatch(self, decision: RoutingDecision, now_wall: float) -> bool:
        self._check()
        key = (decision.request_id, decision.attempt)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > _REMEMBERED_ATTEMPTS:
            self._seen.popitem(last=False)
        entry = self._entries.get(decision.instance_id)
        if entry is None:
            self._end(decision, None, "error", now_wall, error=f"unknown instance {decision.instance_id!r}")
            return True
        attempt = _Attempt(decision, entry)
        self._open[key] = attempt
        attempt.task = asyncio.get_running_loop().create_task(self._generate(attempt))
        return True

    async def abort(self, request_id: str, attempt: int, now_wall: float) -> bool:
        self._check()
        running = self._open.get((request_id, attempt))
        if running is None or running.aborted or running.task is None:
            return False
        running.aborted = True
        running.task.cancel()  # closes the connection: vLLM aborts the request
        return True

    async def load(self, now_wall: float) -> list[Heartbeat]:
        self._check()
        self._start_scrapers()
        in_flight: dict[str, int] = {}
        for attempt in self._open.values():
            tokens = attempt.decision.request.input_tokens + attempt.streamed
            in_flight[attempt.entry.instance_id] = in_flight.get(attempt.entry.instance_id, 0) + tokens
        beats = []
        for entry in self.inventory.instances:
            scraped = self._scraped[entry.instance_id]
            fields = _NO_METRICS
            if scraped.metrics is not None:
                fields = heartbeat_fields(scraped.metrics, None, None, in_flight.get(entry.instance_id, 0))
            beats.append(
                Heartbeat(
                    ts=scraped.ts or now_wall,
                    instance_id=entry.instance_id,
                    dc=entry.dc,
                    model=entry.model,
                    model_version=entry.version,
                    profile="vllm",
                    endpoint_ready=scraped.ready and scraped.metrics is not None,
                    gpus=entry.gpus,
                    price_per_hour=entry.price_per_hour,
                    **fields,  # type: ignore[arg-type]
                )
            )
        return beats

    async def events(self, now_wall: float) -> list[EngineEvent]:
        self._check()
        self._start_scrapers()
        events: list[EngineEvent] = self._outbox
        self._outbox = []
        for subscriber in self._subscribers:
            events.extend(await subscriber.poll())
        events.sort(key=lambda e: e.ts)
        return events

    def next_wakeup(self, now_wall: float) -> float | None:
        # Generations and KV events arrive on their own: look again soon.
        return now_wall + 0.02 if self._open or self._outbox else now_wall + 0.05

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [*self._scrapers, *(a.task for a in self._open.values() if a.task is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for subscriber in self._subscribers:
            subscriber.close()
        if self._session is not None:
            await self._session.close()

    def readiness(self) -> dict[str, bool]:
        """Instance id -> whether its last scrape found it ready (not part of the port)."""
        return {i: s.ready and s.metrics is not None for i, s in self._scraped.items()}

    def kv_stats(self) -> dict[str, dict[str, int]]:
        """Instance id -> its KV-event counters and ``stored_blocks`` (512-token prefix blocks
        it holds now, as its events tell)."""
        found = {}
        for subscriber in self._subscribers:
            stats = subscriber.stats
            found[subscriber.instance_id] = {
                "stored_blocks": len(subscriber.blocks.held),
                "batches": stats.batches,
                "gaps": stats.gaps,
                "resyncs": stats.resyncs,
                "skipped_blocks": stats.skipped_blocks,
            }
        return found

    # -- generations --------------------------------------------------------------------------

    async def _generate(self, attempt: _Attempt) -> None:
        decision = attempt.decision
        request = decision.request
        started = time.time()
        deadline = request.deadline_ts
        timeout = self.request_timeout_s if deadline is None else max(deadline - started, 0.0)
        generation = Generation()

        async def on_event(event: dict[str, object], raw: bytes) -> None:
            if not event.get("choices"):
                return  # the closing usage chunk
            attempt.streamed += 1
            if attempt.streamed == 1:
                self._outbox.append(outcome.first_token(decision, time.time()))

        try:
            path, body = engine_call(request, attempt.entry.served_model_name or decision.model)
            if timeout <= 0:
                raise TimeoutError
            await stream_generation(
                self._http(),
                attempt.entry.url,
                path,
                body,
                on_event=on_event,
                timeout_s=timeout,
                into=generation,
                request_id=engine_request_id(request),
            )
        except asyncio.CancelledError:
            if not attempt.aborted:
                raise  # closing: attempts still open are not reported
            self._end(decision, generation, "aborted", time.time())
        except TimeoutError:
            self._end(decision, generation, "timeout", time.time(), error="past its deadline")
        except (EngineHttpError, aiohttp.ClientError, ValueError, OSError) as exc:
            self._end(decision, generation, "error", time.time(), error=first_line(exc))
        else:
            self._end(decision, generation, "ok", time.time())
        finally:
            self._open.pop((decision.request_id, decision.attempt), None)

    def _end(
        self,
        decision: RoutingDecision,
        generation: Generation | None,
        status: Status,
        now: float,
        error: str = "",
    ) -> None:
        """Queue the ``Response`` and ``Completion`` of an ended attempt."""
        g = generation or Generation()
        self._outbox.append(outcome.response(decision, g, status, now, error))
        self._outbox.append(outcome.completion(decision, g, status, now))
        if error:
            log.info("request %s attempt %d on %s: %s (%s)", decision.request_id, decision.attempt,
                     decision.instance_id, status, error)  # fmt: skip

    # -- scraping -----------------------------------------------------------------------------

    def _start_scrapers(self) -> None:
        if not self._scrapers:
            loop = asyncio.get_running_loop()
            self._scrapers = [loop.create_task(self._scrape_forever(e)) for e in self.inventory.instances]

    async def _scrape_forever(self, entry: InstanceEntry) -> None:
        while True:
            started = time.monotonic()
            await self.scrape(entry)
            await asyncio.sleep(max(self.scrape_s - (time.monotonic() - started), 0.0))

    async def scrape(self, entry: InstanceEntry) -> _Scraped:
        """Read ``entry``'s ``/health`` and ``/metrics`` once (each within ``scrape_s``)."""
        scraped = self._scraped[entry.instance_id]
        timeout = aiohttp.ClientTimeout(total=self.scrape_s)
        try:
            async with self._http().get(entry.url + "/health", timeout=timeout) as health:
                ready = health.status == 200
            async with self._http().get(entry.url + "/metrics", timeout=timeout) as response:
                if response.status != 200:
                    raise EngineHttpError(f"/metrics answered {response.status}", response.status)
                text = await response.text()
            metrics = parse_metrics(text, entry.served_model_name or entry.model)
            heartbeat_fields(metrics, None, None, 0)  # the KV geometry is there (ValueError if not)
            scraped.metrics = metrics
            scraped.ready = ready
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, EngineHttpError) as exc:
            if scraped.ready:
                log.warning("engine %s stopped answering: %s", entry.instance_id, first_line(exc))
            scraped.ready = False
        scraped.ts = time.time()
        return scraped

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Many concurrent streams per instance: no per-host connection cap.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    def _check(self) -> None:
        if self._closed:
            raise EngineError("the vLLM engines are closed")
