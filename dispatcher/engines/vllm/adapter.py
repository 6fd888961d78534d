"""The engine port over real vLLM servers: HTTP for generation, ``/metrics`` for load, ZMQ for KV.

``VllmEngines`` implements ``dispatcher.engines.port.EnginePort`` for the instances of an inventory
(``infra/vllm/inventory.py``):

- ``dispatch`` starts one streamed generation per attempt (``openai_http``), in its own task;
  its first token becomes a ``ResponseStarted``, its end a ``Response`` (the text) and a
  ``Completion`` (TTFT, TPOT and E2E as this dispatcher timed them, from the request's
  ``ts``). A request past its ``deadline_ts`` times out (``timeout``); ``abort`` closes the
  connection, which makes vLLM abort it (``aborted``); an engine that refuses or breaks the
  stream gives ``error``. A decision with a ``prefill_instance_id`` this dispatcher knows runs
  in two steps (``prefill_decode.prefill_then_decode``): prefilled there, decoded on
  ``instance_id``, or wholly on ``instance_id`` when the prefill step fails (local prefill);
  one naming an instance it does not know runs whole on ``instance_id``. Either way its events
  are a whole call's, on ``instance_id``; a prefill step that succeeded adds one before them,
  the end of the prefill leg (``prefill_decode.prefill_done``: a ``ResponseStarted`` with
  ``prefill_leg``, on the prefill instance).
- ``load`` reports what the scrapers last read: every ``scrape_s`` each instance's ``/health``
  and ``/metrics`` (``dispatcher/engines/vllm/metrics.py`` documents each heartbeat field's source);
  ``tokens_in_flight`` is this dispatcher's own count (prompt plus streamed tokens of its open
  attempts there; the service adds the requests gateways run there, ``dispatcher/elsewhere.py``).
  An instance that does not answer a scrape within ``scrape_s`` is reported not ready at once,
  so it leaves the candidates within two scrape intervals of going silent.
- ``events`` also returns the instances' KV-cache changes (``kv_events.KvEventSubscriber``),
  mapped onto TokenFleet's 512-token prefix blocks.

With a ``source`` (the inventory file it was read from) the engines follow that file: ``load``
reads it again whenever it changed (a file that cannot be read keeps the engines as they are,
logged). An instance added is scraped and heartbeat from then on; an instance taken out
**drains**: its heartbeats say ``draining: true`` (no decider sends it anything new), what it
runs finishes, and a decision about it still runs there (one made before the drain). It is
forgotten (no more heartbeats) once it has no attempt of this dispatcher open and its server no
longer answers (it was stopped); the heartbeat that says so is the last. Listed again before
that, it serves again.

Background tasks (scrapers, generations) start at the first call, in the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from dispatcher.engines.port import Endpoint, EngineError, EngineEvent
from dispatcher.engines.vllm.kv_events import KvEventSubscriber
from dispatcher.engines.vllm.metrics import EngineMetrics, heartbeat_fields, parse_metrics
from infra.errors import first_line
from infra.vllm import outcome
from infra.vllm.inventory import InstanceEntry, Inventory, InventoryError, load_inventory
from infra.vllm.openai_http import (
    EngineHttpError,
    Generation,
    engine_call,
    engine_request_id,
)
from infra.vllm.outcome import Status
from infra.vllm.prefill_decode import generate, prefill_done
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
        source: Path | None = None,
    ) -> None:
        if scrape_s <= 0:
            raise ValueError("scrape_s must be > 0")
        self.inventory = inventory
        self.scrape_s = scrape_s
        self.request_timeout_s = request_timeout_s
        self.kv_events = kv_events
        self.source = source  # the inventory file followed (None: the instances never change)
        self._source_stamp: tuple[int, int, int] | None = None  # read again at the first load
        self._entries: dict[str, InstanceEntry] = {}  # listed and draining, in the order added
        self._draining: set[str] = set()
        self._scraped: dict[str, _Scraped] = {}
        self._subscribers: dict[str, KvEventSubscriber] = {}
        self._scrapers: dict[str, asyncio.Task[None]] = {}
        self._endpoints: tuple[Endpoint, ...] = ()
        for entry in inventory.instances:
            self._add(entry)
        self._open: dict[tuple[str, int], _Attempt] = {}
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._outbox: list[EngineEvent] = []
        self._session: aiohttp.ClientSession | None = None
        self._started = False  # the scrapers run (from the first call, in the caller's loop)
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
        self._follow()
        self._start_scrapers()
        in_flight: dict[str, int] = {}
        for attempt in self._open.values():
            tokens = attempt.decision.request.input_tokens + attempt.streamed
            in_flight[attempt.entry.instance_id] = in_flight.get(attempt.entry.instance_id, 0) + tokens
        beats = []
        for entry in list(self._entries.values()):
            scraped = self._scraped[entry.instance_id]
            fields = _NO_METRICS
            if scraped.metrics is not None:
                fields = heartbeat_fields(scraped.metrics, None, None, in_flight.get(entry.instance_id, 0))
            ready = scraped.ready and scraped.metrics is not None
            draining = entry.instance_id in self._draining
            beats.append(
                Heartbeat(
                    ts=scraped.ts or now_wall,
                    instance_id=entry.instance_id,
                    dc=entry.dc,
                    model=entry.model,
                    model_version=entry.version,
                    profile="vllm",
                    endpoint_ready=ready,
                    gpus=entry.gpus,
                    price_per_hour=entry.price_per_hour,
                    draining=draining,
                    role=entry.role,
                    kv_bytes_per_token=entry.kv_bytes_per_token,
                    max_seqs=entry.max_num_seqs,
                    prefill_budget_tokens=entry.max_num_batched_tokens,
                    **fields,  # type: ignore[arg-type]
                )
            )
            if draining and not scraped.ready and entry.instance_id not in in_flight:
                self._forget(entry.instance_id)  # drained and stopped: this beat was its last
        return beats

    async def events(self, now_wall: float) -> list[EngineEvent]:
        self._check()
        self._start_scrapers()
        events: list[EngineEvent] = self._outbox
        self._outbox = []
        for subscriber in list(self._subscribers.values()):
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
        tasks = [*self._scrapers.values(), *(a.task for a in self._open.values() if a.task is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for subscriber in self._subscribers.values():
            subscriber.close()
        if self._session is not None:
            await self._session.close()

    def readiness(self) -> dict[str, bool]:
        """Instance id -> whether its last scrape found it ready (not part of the port)."""
        return {i: s.ready and s.metrics is not None for i, s in self._scraped.items()}

    def draining(self) -> set[str]:
        """The instances taken out of the followed file and not forgotten yet (not part of the port)."""
        return set(self._draining)

    def kv_stats(self) -> dict[str, dict[str, int]]:
        """Instance id -> its KV-event counters and ``stored_blocks`` (512-token prefix blocks
        it holds now, as its events tell)."""
        found = {}
        for subscriber in self._subscribers.values():
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

        def on_prefill_done() -> None:
            self._outbox.append(prefill_done(decision, time.time()))

        try:
            path, body = engine_call(request, attempt.entry.served_model_name or decision.model)
            if timeout <= 0:
                raise TimeoutError
            prefill = self._prefill_entry(decision)
            fallback = await generate(
                self._http(),
                attempt.entry.url,
                path,
                body,
                prefill_url=None if prefill is None else prefill.url,
                timeout_s=timeout,
                on_event=on_event,
                into=generation,
                request_id=engine_request_id(request),
                on_prefill_done=on_prefill_done,
            )
            if fallback:
                log.info(
                    "request %s attempt %d: local prefill on %s, not on %s (%s)",
                    request.request_id,
                    decision.attempt,
                    decision.instance_id,
                    decision.prefill_instance_id,
                    fallback,
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

    def _prefill_entry(self, decision: RoutingDecision) -> InstanceEntry | None:
        """The instance that prefills the decision's request (None: it runs whole)."""
        if not decision.prefill_instance_id:
            return None
        entry = self._entries.get(decision.prefill_instance_id)
        if entry is None:
            log.info(
                "request %s attempt %d: prefill instance %r unknown: local prefill on %s",
                decision.request_id,
                decision.attempt,
                decision.prefill_instance_id,
                decision.instance_id,
            )
        return entry

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
        if not self._started:
            self._started = True
            for instance_id in self._entries:
                self._start_scraper(instance_id)

    def _start_scraper(self, instance_id: str) -> None:
        entry = self._entries[instance_id]
        self._scrapers[instance_id] = asyncio.get_running_loop().create_task(self._scrape_forever(entry))

    # -- following the inventory file -----------------------------------------------------------

    def _follow(self) -> None:
        """Take up the followed file's changes (module docstring), if it changed since last read."""
        if self.source is None:
            return
        stamp = _stamp(self.source)
        if stamp is None or stamp == self._source_stamp:
            return  # unchanged, or being replaced: next time
        self._source_stamp = stamp
        try:
            fresh = load_inventory(self.source)
        except InventoryError as exc:
            log.warning("the engines stay as they are: %s", exc)
            return
        listed = {entry.instance_id: entry for entry in fresh.instances}
        for instance_id, entry in listed.items():
            known = self._entries.get(instance_id)
            if known is not None and known != entry:  # another server under the same id
                self._forget(instance_id)
                known = None
            if known is None:
                self._add(entry)
                if self._started:
                    self._start_scraper(instance_id)
                log.info("engine %s added (%s)", instance_id, entry.url)
            elif instance_id in self._draining:
                self._draining.discard(instance_id)
                log.info("engine %s listed again: it serves again", instance_id)
        for instance_id in self._entries.keys() - listed.keys() - self._draining:
            self._draining.add(instance_id)
            log.info("engine %s taken out: draining", instance_id)
        self.inventory = fresh

    def _add(self, entry: InstanceEntry) -> None:
        self._entries[entry.instance_id] = entry
        self._scraped[entry.instance_id] = _Scraped()
        if self.kv_events and entry.kv_events is not None:
            self._subscribers[entry.instance_id] = KvEventSubscriber(
                entry.instance_id, entry.model, entry.kv_events, entry.kv_replay
            )
        self._endpoints = (
            *self._endpoints,
            Endpoint(entry.instance_id, entry.dc, entry.model, entry.version, "vllm"),
        )

    def _forget(self, instance_id: str) -> None:
        """No more scrapes, KV events or heartbeats of ``instance_id`` (a decision about it fails)."""
        self._entries.pop(instance_id, None)
        self._scraped.pop(instance_id, None)
        self._draining.discard(instance_id)
        scraper = self._scrapers.pop(instance_id, None)
        if scraper is not None:
            scraper.cancel()
        subscriber = self._subscribers.pop(instance_id, None)
        if subscriber is not None:
            subscriber.close()
        self._endpoints = tuple(e for e in self._endpoints if e.instance_id != instance_id)
        log.info("engine %s forgotten", instance_id)

    async def _scrape_forever(self, entry: InstanceEntry) -> None:
        while True:
            started = time.monotonic()
            await self.scrape(entry)
            await asyncio.sleep(max(self.scrape_s - (time.monotonic() - started), 0.0))

    async def scrape(self, entry: InstanceEntry) -> _Scraped:
        """Read ``entry``'s ``/health`` and ``/metrics`` once (each within ``scrape_s``)."""
        scraped = self._scraped.get(entry.instance_id, _Scraped())  # (forgotten meanwhile: unused)
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


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What tells a file changed: its inode, size and modification time (None: unreadable)."""
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)
