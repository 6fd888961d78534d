"""The scheduler's stream handlers: raw messages in -> decode -> routing service -> events out.

One class with a plain async method per input topic, so the whole streaming behaviour is
unit-testable with fakes; ``streams/binding.py`` attaches the methods to the Faust app. Every
input that cannot be decoded goes to ``tf.dlq`` with its original bytes and the reason, and the
handler goes on with the next message.

Requests are read at least once and decided exactly once: the request lane passes each
message's (partition, offset) ``Position``; ``commit_floor`` says, per partition, the oldest
position of a request still held, which the lane must not commit past (so a restart reads a held
request again and it is not lost); and after a restart or a rebalance the lane replays the
pool's recent ``tf.admission`` decisions into ``on_replayed_admissions`` first, so a request
decided before, and read again, is not decided twice: its decision is published again, with
the same event id (``RoutingService.answers_again``), which is how a client's resend of a request
whose answer a broker lost gets one.

After every offer (a request batch, a heartbeat that re-offered held requests, the timer) what
the stages noticed (FleetMind's DC state changes, reservation moves, replica advice) is
published on ``tf.fleet-events`` and counted.

Nothing here writes to the store: every row (requests, decisions, completions, fleet events,
heartbeats) is stored from its topic by the store's own consumer
(``infra/clickhouse/topic_sink.py``), which commits an offset only once the row is durable, so
a row never lives only in this process's memory.

Several deciders per pool: every decider reads the state topics whole (heartbeats, KV events,
first tokens, completions, and the others' placements on ``tf.decisions``), so those handlers
skip what does not decode without a word: dead-lettering them once is the job of
``agents.keeping.LogKeeper``, run on the partitions the consumer group gave this worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from functools import partial
from typing import TypeVar

from agents.affinity import HotPrefixes
from agents.batch import expand_batch_job
from agents.keeping import decode_all, send_dead_letters
from agents.ports import InstanceState, PromptCompleter, Publisher, Telemetry
from agents.routing import Answer, Routed, RoutingService
from schemas import topics
from schemas.codec import DecodeError, RawMessage, decode
from schemas.events import (
    AdmissionDecision,
    BatchJob,
    Completion,
    Event,
    Heartbeat,
    InferenceRequest,
    KvEvent,
    ResponseStarted,
    RoutingDecision,
)

E = TypeVar("E", bound=Event)
Position = tuple[int, int]
"""(partition, offset) of a message in ``tf.requests``."""
_Key = tuple[str, str, int]  # (pool, request id, attempt)
DirectKey = _Key
log = logging.getLogger(__name__)
_HOLD = b'"action":"queue"'  # a hold on tf.admission, as every scheduler encodes it (compact JSON)


class Refused(ValueError):
    """A request asked for directly cannot be decided: it does not decode, or its prompt cannot
    be counted (it is dead-lettered with the same reason)."""

    def __init__(self, request_id: str, attempt: int, reason: str) -> None:
        super().__init__(reason)
        self.request_id, self.attempt = request_id, attempt


class SchedulerAgents:
    def __init__(
        self,
        service: RoutingService,
        state: InstanceState,
        publisher: Publisher,
        telemetry: Telemetry,
        prompts: PromptCompleter | None = None,
    ) -> None:
        self.service = service
        self.prompts = prompts
        self.state = state
        self.publisher = publisher
        self.telemetry = telemetry
        self.hot_prefixes = HotPrefixes()  # batch jobs' requests, published here
        self._position_of: dict[_Key, Position] = {}  # arrived in the batch being handled
        self._held_at: dict[_Key, Position] = {}  # held requests: where the lane read them
        self._direct: dict[_Key, asyncio.Future[Event]] = {}  # asked directly, answer not final yet
        self._recording: set[asyncio.Future[None]] = set()  # direct requests' records on their way
        self._wakes: dict[str, float] = {}  # pool -> when a timer offers its deferred requests
        self._waking: set[asyncio.Future[None]] = set()

    # --- handlers, one per input topic --------------------------------------------------------

    async def on_requests(
        self, messages: Sequence[RawMessage], positions: Sequence[Position] = ()
    ) -> Awaitable[object]:
        """Route one batch of raw request messages (the request lane calls this, with each
        message's position); returns the delivery of its decisions, which the lane awaits
        before committing the batch."""
        arrived = time.perf_counter()
        where = dict(zip((id(m) for m in messages), positions, strict=False))
        decoded = await self._with_prompts_counted(
            await self._decode_all(InferenceRequest, topics.REQUESTS, messages)
        )
        decoded = [(r, m) for r, m in decoded if not r.decided_by]  # the log's copy of a direct one
        for request, message in decoded:
            position = where.get(id(message))
            if position is not None:
                self._position_of[(request.model, request.request_id, request.attempt)] = position
        routed: list[Routed] = []
        again: list[Answer] = []
        failed: list[tuple[RawMessage, str]] = []
        now = time.time()
        for pool, group in _by_pool(decoded).items():
            again += self.service.answers_again(pool, [request for request, _ in group])
            routed += self._route(pool, group, now, failed)
            self.telemetry.queue_depth(pool, self.service.held(pool))
        await self._dead_letter(topics.REQUESTS, failed)
        self._track(routed, [request for request, _ in decoded])
        delivered = await self._send(routed, again)
        self.telemetry.decided_batch(self.service.policy_name, routed, time.perf_counter() - arrived)
        return asyncio.gather(delivered, await self._tell_fleet())

    async def on_direct(self, value: bytes) -> tuple[DirectKey, asyncio.Future[Event]]:
        """A request a gateway asked this decider about directly (``streams/direct.py``):
        decided now, exactly as a request read from the log (same stages, same accounting, once
        per attempt: one decided before gets the answer it had). Its record (``decided_by`` set,
        so no request lane decides it again) and its decisions are published; the result is its
        key and a future of its final answer, the ``RoutingDecision`` or the rejecting
        ``AdmissionDecision`` (a held request's completes when a heartbeat routes it or its hold
        expires). Raises ``Refused`` (after dead-lettering it) for what cannot be decided."""
        arrived = time.perf_counter()
        message: RawMessage = (None, value)
        good, dead = decode_all(InferenceRequest, [message])
        if good:
            try:
                request = (await self._counted(good[0][0])).model_copy(
                    update={"decided_by": self.service.worker}
                )
            except ValueError as exc:
                dead = [(message, f"prompt: {exc}")]
        if dead:
            await self._dead_letter(topics.REQUESTS, dead)
            raise Refused(*_named(value), dead[0][1])
        key = (request.model, request.request_id, request.attempt)
        answer: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        again = self.service.answers_again(request.model, [request])
        if again:  # asked again (the gateway lost the answer): the answer it had
            final = again[0].routing or again[0].admission
            if final is not None and _final(final):
                answer.set_result(final)
                return key, answer
        self._direct[key] = answer
        failed: list[tuple[RawMessage, str]] = []
        routed = self._route(request.model, [(request, message)], time.time(), failed)
        if failed:
            del self._direct[key]
            await self._dead_letter(topics.REQUESTS, failed)
            raise Refused(request.request_id, request.attempt, failed[0][1])
        self._answer_direct(routed)
        # Recorded after this returns: the caller's answer leaves first.
        self._spawn_record(request, routed, time.perf_counter() - arrived)
        return key, answer

    def _spawn_record(self, request: InferenceRequest, routed: list[Routed], latency_s: float) -> None:
        """Publish a direct request's record and its decisions (a task: the answer goes first)."""

        async def record() -> None:
            self.telemetry.queue_depth(request.model, self.service.held(request.model))
            recorded = await self.publisher.send(topics.REQUESTS, [request])
            delivered = await self._send(routed)
            self.telemetry.decided_batch(self.service.policy_name, routed, latency_s)
            await asyncio.gather(recorded, delivered, await self._tell_fleet())

        task = asyncio.ensure_future(record())
        self._recording.add(task)
        task.add_done_callback(partial(_recorded, self._recording, request.request_id))

    def on_direct_gone(self, key: DirectKey) -> None:
        """The gateway that asked for ``key`` is gone: a request still held for it is let go
        (its caller's next attempt is asked of another decider)."""
        answer = self._direct.pop(key, None)
        if answer is not None and not answer.done():
            answer.cancel()
        self.service.withdraw(*key)

    async def on_heartbeats(self, messages: Sequence[RawMessage]) -> None:
        """Record each heartbeat; then offer the held requests of every pool whose snapshot changed
        (a held request is routed at the first heartbeat that makes room, with no further
        request arriving)."""
        arrived = time.perf_counter()
        beats = _quietly(Heartbeat, messages)
        for beat in beats:
            self.state.record(beat)
        pools = [beat.model for beat in beats]
        routed: list[Routed] = []
        ticked = False
        now = time.time()
        for pool in dict.fromkeys(pools):
            if self.service.held(pool):
                view = self.state.view(pool)
                if view is not None:
                    routed += self.service.tick(pool, view, now)
                    self.telemetry.queue_depth(pool, self.service.held(pool))
                    self._wake_later(pool)  # decider k of n offers them k log delays later
                    ticked = True
        if routed:
            await self._settle_held(routed, time.perf_counter() - arrived)
        if ticked:  # only an offer makes the stages look at the fleet, so only then can they notice
            await (await self._tell_fleet())

    async def on_timer(self) -> None:
        """Every second or so: reject what was held too long, in every pool (also the pools
        no instance ever reports for, which no heartbeat would wake up); let every pool's
        stages look at the fleet (a DC whose heartbeats stopped is noticed without a request);
        publish what they noticed."""
        now = time.time()
        routed = self.service.expire(now)
        if routed:
            for pool in {r.request.model for r in routed}:
                self.telemetry.queue_depth(pool, self.service.held(pool))
            await self._settle_held(routed, 0.0)
        for pool in self.service.pools():  # a DC that went quiet is noticed without a request
            view = self.state.view(pool)
            if view is not None:
                self.service.refresh(pool, view, now)
        await (await self._tell_fleet())

    async def on_replayed_admissions(self, messages: Sequence[RawMessage]) -> None:
        """Decisions this scheduler sent before (read back from ``tf.admission`` by the lane
        after it was assigned partitions): the requests they settled are not decided again."""
        for _, value in messages:
            try:
                answer = decode(AdmissionDecision, value)
            except DecodeError:
                continue  # not ours to judge: the topic's writers are schedulers
            if answer.action != "queue":
                self.service.remember_decided(answer)

    def on_partitions_revoked(self, partitions: set[int]) -> None:
        """The worker gives up ``partitions`` of ``tf.requests``: drop the requests it holds from
        them (their offsets were not committed: the partitions' new owner reads them again)."""
        for key, (partition, _) in list(self._held_at.items()):
            if partition in partitions:
                self.service.withdraw(*key)
                del self._held_at[key]

    def commit_floor(self) -> dict[int, int]:
        """Per partition of ``tf.requests``, the oldest offset of a request still held."""
        floor: dict[int, int] = {}
        for partition, offset in self._held_at.values():
            floor[partition] = min(offset, floor.get(partition, offset))
        return floor

    async def on_kv_events(self, messages: Sequence[RawMessage]) -> None:
        for event in _quietly(KvEvent, messages):
            self.service.observe_kv(event)

    async def on_first_tokens(self, messages: Sequence[RawMessage]) -> None:
        """First tokens and ends of prefill legs (``prefill_leg``) on ``tf.first-tokens``."""
        for event in _quietly(ResponseStarted, messages):
            self.service.observe_first_token(event)

    async def on_completions(self, messages: Sequence[RawMessage]) -> None:
        for completion in _quietly(Completion, messages):
            self.service.observe_completion(completion)

    async def on_decisions(self, messages: Sequence[RawMessage]) -> None:
        """Placements on ``tf.decisions``: the other deciders' are accounted as this worker's
        own (``RoutingService.observe_placement``); its own are skipped, before decoding (half
        of what a pair of workers reads)."""
        mine = f'"worker":"{self.service.worker}"'.encode()
        others = [m for m in messages if m[1] is None or mine not in m[1]]
        applied: dict[str, int] = defaultdict(int)
        for decision in _quietly(RoutingDecision, others):
            if self.service.observe_placement(decision):
                applied[decision.model] += 1
        for pool, count in applied.items():
            self.telemetry.placements_observed(pool, count)

    async def on_admissions(self, messages: Sequence[RawMessage]) -> None:
        """New holds on ``tf.admission``: the other deciders' are counted by an admission stage
        that yields to the pool's waiting work (``RoutingService.observe_hold``); admits and
        rejects are skipped before decoding (a placement comes on ``tf.decisions``)."""
        holds = [m for m in messages if m[1] is not None and _HOLD in m[1]]
        for decision in _quietly(AdmissionDecision, holds):
            self.service.observe_hold(decision)

    async def on_batch_jobs(self, messages: Sequence[RawMessage]) -> None:
        """A job's requests onto ``tf.requests`` (a job's shared instructions are a hot prefix:
        spread over the pool's deciders, ``agents.affinity``)."""
        for job in await self._decoded(BatchJob, topics.BATCH_JOBS, messages):
            now = time.time()
            requests = [self.hot_prefixes.place(r, now) for r in expand_batch_job(job)]
            await (await self.publisher.send(topics.REQUESTS, requests))

    # --- helpers ------------------------------------------------------------------------------

    async def _settle_held(self, routed: Sequence[Routed], latency_s: float) -> None:
        """Publish the outcomes of held requests (a heartbeat made room, or they expired), wait
        until the broker has them, and count them."""
        self._track(routed)
        self._answer_direct(routed)
        delivered = await self._send(routed)
        self.telemetry.decided_batch(self.service.policy_name, routed, latency_s)
        await delivered

    def _answer_direct(self, routed: Sequence[Routed]) -> None:
        """Complete the direct callers' answers that became final (placed or rejected)."""
        if not self._direct:
            return
        for r in routed:
            if r.admission.action == "queue":
                continue
            answer = self._direct.pop((r.request.model, r.request.request_id, r.request.attempt), None)
            if answer is not None and not answer.done():
                answer.set_result(r.routing or r.admission)

    def _track(self, routed: Sequence[Routed], arrived: Sequence[InferenceRequest] = ()) -> None:
        """Remember where each newly held request was read, forget the settled ones."""
        for r in routed:
            key = (r.request.model, r.request.request_id, r.request.attempt)
            if r.admission.action == "queue":
                position = self._position_of.get(key)
                if position is not None:
                    self._held_at[key] = position
            else:
                self._held_at.pop(key, None)
        for request in arrived:  # positions are needed only until the request's first answer
            self._position_of.pop((request.model, request.request_id, request.attempt), None)

    async def _with_prompts_counted(
        self, decoded: list[tuple[InferenceRequest, RawMessage]]
    ) -> list[tuple[InferenceRequest, RawMessage]]:
        """Requests whose prompt still needs counting and hashing get it (``PromptCompleter``);
        one that cannot be counted is dead-lettered with the reason."""
        good, dead = [], []
        for request, message in decoded:
            try:
                good.append((await self._counted(request), message))
            except ValueError as exc:
                dead.append((message, f"prompt: {exc}"))
        await self._dead_letter(topics.REQUESTS, dead)
        return good

    async def _counted(self, request: InferenceRequest) -> InferenceRequest:
        """``request`` with its prompt counted and hashed (a long one on a thread: other calls
        go on meanwhile); ``ValueError`` if it cannot be."""
        if self.prompts is not None:
            request = await self.prompts.complete_off_loop(request)
        if request.input_tokens == 0:
            raise ValueError("the prompt is not counted: send input_tokens (this worker has no tokenizer)")
        return request

    async def _decoded(
        self, kind: type[E], spec: topics.TopicSpec, messages: Sequence[RawMessage]
    ) -> list[E]:
        """Decode a batch; dead-letter (and wait for the broker to have) what does not decode."""
        return [event for event, _ in await self._decode_all(kind, spec, messages)]

    async def _decode_all(
        self, kind: type[E], spec: topics.TopicSpec, messages: Sequence[RawMessage]
    ) -> list[tuple[E, RawMessage]]:
        """``_decoded``, each event with the raw message it came from."""
        good, dead = decode_all(kind, messages)
        await self._dead_letter(spec, dead)
        return good

    def _wake_later(self, pool: str) -> None:
        """Offer ``pool``'s deferred requests when they are due (``Scheduler.next_wake_s``:
        with several deciders an arrival, or a held request on a new heartbeat, waits a few
        milliseconds for the log)."""
        due = self.service.next_wake(pool)
        armed = self._wakes.get(pool)
        if due is None or (armed is not None and armed <= due):
            return
        self._wakes[pool] = due
        asyncio.get_running_loop().call_later(max(due - time.time(), 0.0), self._spawn_wake, pool)

    def _spawn_wake(self, pool: str) -> None:
        task = asyncio.ensure_future(self._wake(pool))
        self._waking.add(task)
        task.add_done_callback(partial(_woken, self._waking, pool))

    async def _wake(self, pool: str) -> None:
        self._wakes.pop(pool, None)
        view = self.state.view(pool)
        if view is not None:
            routed = self.service.tick(pool, view, time.time())
            self.telemetry.queue_depth(pool, self.service.held(pool))
            if routed:
                await self._settle_held(routed, 0.0)
        self._wake_later(pool)

    async def _dead_letter(self, spec: topics.TopicSpec, dead: Sequence[tuple[RawMessage, str]]) -> None:
        """Send each (message, reason) to ``tf.dlq`` and wait until the broker has them."""
        await send_dead_letters(self.publisher, self.telemetry, spec, dead)

    def _route(
        self,
        pool: str,
        group: list[tuple[InferenceRequest, RawMessage]],
        now: float,
        failed: list[tuple[RawMessage, str]],
    ) -> list[Routed]:
        """Route a pool's requests as one batch; if that fails, one by one, so only a request that
        cannot be scheduled fails (dead-lettered with the error), never its whole batch."""
        view = self.state.view(pool)
        try:
            routed = self.service.route(pool, [request for request, _ in group], view, now)
        except Exception:
            log.exception(
                "a batch of %d requests of pool %.64r failed; routing them one by one", len(group), pool
            )
            routed = []
            for request, raw in group:
                try:
                    routed += self.service.route(pool, [request], view, now)
                except Exception as exc:
                    log.exception("request %.256r could not be scheduled", request.request_id)
                    failed.append((raw, f"not schedulable: {exc!r}"[:1024]))
        self._wake_later(pool)
        return routed

    async def _send(self, routed: Sequence[Routed], again: Sequence[Answer] = ()) -> Awaitable[object]:
        """Publish the outcomes, and the decisions made before that are answered ``again`` (as
        they were: same event ids; not counted or stored anew)."""
        admissions = [r.admission for r in routed] + [a.admission for a in again if a.admission is not None]
        routings = [r.routing for r in routed if r.routing is not None]
        routings += [a.routing for a in again if a.routing is not None]
        return asyncio.gather(
            await self.publisher.send(topics.ADMISSION, admissions),
            await self.publisher.send(topics.DECISIONS, routings),
        )

    async def _tell_fleet(self) -> Awaitable[object]:
        """Publish what the schedulers noticed since the last call (``tf.fleet-events``) and
        count it; the result completes when the broker has it."""
        events = self.service.notices()
        if not events:
            return asyncio.gather()
        delivered = await self.publisher.send(topics.FLEET_EVENTS, events)
        self.telemetry.fleet_events(events)
        return delivered


def _final(decision: Event) -> bool:
    """A placement or a reject (a hold is not an answer yet)."""
    return isinstance(decision, RoutingDecision) or (
        isinstance(decision, AdmissionDecision) and decision.action == "reject"
    )


def _named(value: bytes) -> tuple[str, int]:
    """The request id and attempt a message that is not a valid request names, if it does."""
    try:
        fields = json.loads(value)
        return str(fields.get("request_id", ""))[:256], int(fields.get("attempt", 1))
    except (ValueError, TypeError, AttributeError):
        return "", 0


def _recorded(recording: set[asyncio.Future[None]], request_id: str, task: asyncio.Future[None]) -> None:
    """Log (not raise) a direct request's record that did not reach the log."""
    recording.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("request %.256s: its record did not reach the log: %s", request_id, task.exception())


def _woken(waking: set[asyncio.Future[None]], pool: str, task: asyncio.Future[None]) -> None:
    """Log (not raise) an offer of deferred requests that failed (their hold expires as any)."""
    waking.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("pool %.64r: offering its deferred requests failed: %r", pool, task.exception())


def _quietly(kind: type[E], messages: Sequence[RawMessage]) -> list[E]:
    """The messages of a state topic that decode (the rest is ``LogKeeper``'s to dead-letter)."""
    return [event for event, _ in decode_all(kind, messages)[0]]


def _by_pool(
    decoded: Sequence[tuple[InferenceRequest, RawMessage]],
) -> dict[str, list[tuple[InferenceRequest, RawMessage]]]:
    pools: dict[str, list[tuple[InferenceRequest, RawMessage]]] = defaultdict(list)
    for request, raw in decoded:
        pools[request.model].append((request, raw))
    return pools
