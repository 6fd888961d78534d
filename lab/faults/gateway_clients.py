"""The gateway scenarios' measuring apparatus at the client: callers through the official ``openai``
client, the probes of ``/ready`` and ``tokenfleet status``, and the engines' own counts.

- ``Callers``: ``AsyncOpenAI`` as a user sets it up (``TIMEOUT_S`` per HTTP attempt, connect
  ``CONNECT_TIMEOUT_S``, ``max_retries`` ``MAX_RETRIES``: the client's default, which retries
  408, 409, 429, 5xx and connection errors with back-off and honours ``Retry-After``), each
  call with an ``x-request-id`` of its own (``extra_headers``: its retries carry it too),
  every other call streamed (with ``include_usage``). Every HTTP attempt is timed by a transport
  wrapped around the client's own (``_Timed``): when it left, when its headers came or it
  failed, its status. What the calls saw is kept as ``lab.faults.gateway_tally.Call``.
- ``Probes``: the gateway's ``/ready`` every ``READY_EVERY_S`` (no answer counts as not ready)
  and what ``tokenfleet status`` shows (``local.refresh``, the function it prints) every
  ``STATUS_EVERY_S``: ready when every part of the stack is ``ready`` (an inventory's engine:
  ``up``).
- ``EngineCounts``: each engine's starts by request id, polled every ``ENGINE_EVERY_S`` from
  the emulated server's ``GET /debug/served``, or, on vLLM, the total of
  ``vllm:request_success_total`` (every finish reason, aborts included) from ``/metrics``. An
  engine whose counts went down was restarted: what its earlier process counted is kept. What
  an engine started after its last poll before it was killed is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import openai
from prometheus_client.parser import text_string_to_metric_families

from lab.faults.gateway_tally import Attempt, Call, Sample
from local import refresh

TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
MAX_RETRIES = 2
READY_EVERY_S = 0.25
STATUS_EVERY_S = 1.0
ENGINE_EVERY_S = 0.5
REQUEST_ID = "x-request-id"
_SYSTEMS = (
    "You are a terse assistant for a logistics company. Answer in one sentence.",
    "You translate questions about Kafka into plain English for new engineers.",
    "You are a code reviewer. Point out the single most important problem.",
)
_TOPICS = ("partitions", "consumer groups", "offsets", "retention", "compaction", "rebalances", "acks")


class _Timed(httpx2.AsyncBaseTransport):
    """The client's transport, timing each HTTP attempt of a call (by its ``x-request-id``)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, record: Callable[[str, Attempt], None]) -> None:
        self.inner, self.record = inner, record

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        call_id, sent = request.headers.get(REQUEST_ID, ""), time.time()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            self.record(call_id, Attempt(sent, time.time(), None, type(exc).__name__))
            raise
        self.record(call_id, Attempt(sent, time.time(), response.status_code))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class Callers:
    """Calls to the gateway at ``base_url`` with ``api_key`` for ``model``; ``calls`` keeps every
    call, by id, in the order they started. ``prefix`` makes the ids unique to the run."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        prefix: str,
        concurrency: int = 6,
        max_tokens: tuple[int, int] = (16, 48),
        seed: int = 0,
        documents: int = 0,
    ) -> None:
        self.model, self.prefix, self.concurrency, self.max_tokens = model, prefix, concurrency, max_tokens
        self.calls: dict[str, Call] = {}
        self.rng = random.Random(seed)
        # documents > 0: each call's system prompt is one of that many long documents (beyond the
        # 2 048-token affinity prefix), so calls spread over the partitions and their deciders
        # by their prefix, as a pool's traffic does; 0: short system prompts (one partition).
        self.systems = [_document(random.Random(i)) for i in range(documents)] or list(_SYSTEMS)
        self._next = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        transport = _Timed(httpx2.AsyncHTTPTransport(), self._attempt)
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=httpx2.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            max_retries=MAX_RETRIES,
            http_client=openai.DefaultAsyncHttpxClient(transport=transport),
        )

    def _attempt(self, call_id: str, attempt: Attempt) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            call.attempts.append(attempt)

    async def run(self, count: int, seconds: float) -> None:
        """``count`` calls spread evenly over ``seconds``, at most ``concurrency`` at once (a call
        due while all are busy starts when one ends: the schedule slips, as a client pool's
        does); returns once every call ended."""
        began = time.monotonic()
        for i in range(count):
            delay = began + i * seconds / max(1, count) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._slots.acquire()
            task = asyncio.create_task(self._one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await self.drain()

    async def drain(self) -> None:
        """Wait for every call started to end (each is bounded by the client's timeouts)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _one(self) -> None:
        try:
            self._next += 1
            call_id = f"{self.prefix}-{self._next:05d}"
            streamed = self._next % 2 == 0
            call = Call(call_id, streamed, time.time())
            self.calls[call_id] = call
            try:
                await self._ask(call)
                call.outcome = "ok"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                call.outcome, call.error = "failed", _error(exc)
            call.ended = time.time()
        finally:
            self._slots.release()

    async def _ask(self, call: Call) -> None:
        messages: Any = [
            {"role": "system", "content": self.rng.choice(self.systems)},
            {"role": "user", "content": f"Call {call.call_id}: explain {self.rng.choice(_TOPICS)} briefly."},
        ]
        common: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.rng.randint(*self.max_tokens),
            "extra_headers": {REQUEST_ID: call.call_id},
        }
        if not call.streamed:
            answer = await self.client.chat.completions.create(**common)
            call.answer_ids.append(answer.id)
            return
        stream = await self.client.chat.completions.create(
            **common, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:  # each id as it comes: a stream that breaks keeps what it had
            if chunk.id not in call.answer_ids:
                call.answer_ids.append(chunk.id)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()


def _document(rng: random.Random, words: int = 900) -> str:
    """A long system prompt of ``words`` words drawn by ``rng`` (more than the 2 048 tokens that
    decide a request's partition, with the tiny model's tokenizer)."""
    vocabulary = [*_TOPICS, "broker", "replica", "leader", "segment", "producer", "batch", "latency"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def _error(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__} {status}" if status is not None else type(exc).__name__


class Probes:
    """``/ready`` at ``ready_url`` and the ``status`` of the stack in ``stack_dir`` (None: not
    probed), sampled in the background between ``start`` and ``stop``. ``parts``: per sample of
    status, the state of each part (``refresh``'s words) at that time."""

    def __init__(self, ready_url: str, stack_dir: Path | None) -> None:
        self.ready_url, self.stack_dir = ready_url, stack_dir
        self.ready: list[Sample] = []
        self.status: list[Sample] = []
        self.parts: list[tuple[float, dict[str, str]]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._ready())]
        if self.stack_dir is not None:
            self._tasks.append(asyncio.create_task(self._status(self.stack_dir)))

    async def _ready(self) -> None:
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                at, ok = time.time(), False
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.get(self.ready_url) as answer:
                        await answer.read()
                        ok = answer.status == 200
                self.ready.append(Sample(at, ok))
                await asyncio.sleep(READY_EVERY_S)

    async def _status(self, directory: Path) -> None:
        while True:
            at = time.time()
            seen = await asyncio.to_thread(refresh, directory)
            now = {} if seen is None else seen[1]
            self.parts.append((at, now))
            self.status.append(Sample(at, bool(now) and all(s in ("ready", "up") for s in now.values())))
            await asyncio.sleep(STATUS_EVERY_S)

    def part_down_s(self, name: str, span: tuple[float, float]) -> float:
        """Seconds within ``span`` that status showed part ``name`` other than ready."""
        down = 0.0
        ends = [at for at, _ in self.parts[1:]] + [span[1]] if self.parts else []
        for (at, parts), end in zip(self.parts, ends, strict=True):
            lo, hi = max(at, span[0]), min(end, span[1])
            if hi > lo and parts.get(name, "ready") not in ("ready", "up"):
                down += hi - lo
        return down

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class EngineCounts:
    """Starts by request id on each engine of ``engines`` (name -> base URL, no ``/v1``), summed
    over the engine's processes. ``vllm``: real vLLM servers, whose counts have no ids (all
    under ``""``)."""

    def __init__(self, engines: Mapping[str, str], vllm: bool = False) -> None:
        self.engines, self.vllm = dict(engines), vllm
        self._before: dict[str, Counter[str]] = {name: Counter() for name in engines}
        self._now: dict[str, Counter[str]] = {name: Counter() for name in engines}
        self.restarts_seen: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(ENGINE_EVERY_S)

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        for name, url in self.engines.items():
            try:
                counts = await (self._vllm(session, url) if self.vllm else self._served(session, url))
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                continue  # down (killed, restarting): its last counts stand
            self.take(name, counts)

    def take(self, name: str, counts: Counter[str]) -> None:
        """A new reading of engine ``name``: lower than the last one is a new process."""
        last = self._now[name]
        if any(counts[k] < n for k, n in last.items()):
            self._before[name] += last
            self.restarts_seen[name] += 1
        self._now[name] = counts

    @staticmethod
    async def _served(session: aiohttp.ClientSession, url: str) -> Counter[str]:
        async with session.get(f"{url}/debug/served") as answer:
            body = await answer.json()
        return Counter({str(k): int(v) for k, v in body["requests"].items()})

    @staticmethod
    async def _vllm(session: aiohttp.ClientSession, url: str) -> Counter[str]:
        async with session.get(f"{url}/metrics") as answer:
            text = await answer.text()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:request_success_total":
                    total += sample.value
        return Counter({"": int(total)})

    def served(self) -> Counter[str]:
        """Starts by request id, over every engine and process."""
        out: Counter[str] = Counter()
        for name in self.engines:
            out += self._before[name] + self._now[name]
        return out

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            await self.poll_once(session)  # the last word of every engine still up


def engines_of(parts: Sequence[Any]) -> dict[str, str]:
    """The stack's engine servers (emulated or vLLM parts of ``StackState.parts``): name -> base
    URL."""
    return {p.name: p.address.removesuffix("/v1") for p in parts if p.kind in ("emulated", "vllm")}
