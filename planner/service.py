"""The planner's loop: the topics in, ``ReplicaPlan``s out on ``tf.plans``, one active planner per
fleet.

**One active planner, Kafka's group as the coordinator.** Every planner process of a fleet joins
the consumer group ``<app id>-planner`` on ``tf.plans`` (sticky assignment, its partitions
paused: the group is only a lease). The member that holds partition 0 is the active planner; the
others wait. When the active one dies its session times out and the group gives partition 0 to
another member; one that stops cleanly leaves the group, and the next takes over at once. During
a rebalance nobody publishes (every partition is revoked first). The same pattern elects
Schema Registry's primary (confluentinc/schema-registry: its design notes, "Kafka Coordinator
Primary Election", and KafkaGroupLeaderElector.java), and as there the new primary acts only
once it has caught up with the log.

**Restart-safe: the state is rebuilt from the topics.** Every planner, active or waiting, reads
the input topics whole (``tf.heartbeats``, ``tf.requests``, ``tf.admission``,
``tf.completions`` and ``tf.plans``) outside any group. At start it reads back the last
``history_s`` seconds, sorts them by timestamp and replays them through the fold
(``planner/fleet_state.py``) and the planner, asking for a plan at every tick of the window and
publishing none of them: the planner's own history (its forecasts, its stabilisation windows)
is rebuilt, and the newest plan of each pool read back is what was published. A waiting planner
keeps folding and planning live, so it takes over with the same history. Ticks fall on the
multiples of ``interval_s`` (wall clock), so every planner cuts the demand into the same windows.

**Every tick** (``interval_s``): ``snapshot`` the fold, ask the planner (``plan(state)``); the active
planner publishes one ``ReplicaPlan`` per pool the plan names when its replicas, its prefill
replicas (``Plan.prefill``) or its warm set changed from the newest plan on ``tf.plans``, or when
that plan is ``keepalive_intervals`` ticks old (``plans_to_publish``), waits until the broker
has them, and shows the newest plan of every pool on the ``tokenfleet_desired_replicas`` gauge
(summed over a model's versions, per model and DC). A waiting planner shows nothing there. The
plans reach ClickHouse from the topic (the store's own consumer,
``infra/clickhouse/topic_sink.py``), like every other row.

**Bad inputs.** A message that does not decode is skipped. Those of ``tf.admission`` and
``tf.plans``, which no worker dead-letters, are sent to ``tf.dlq`` with the reason by the
active planner, as it reads them live (the window read back at start was its predecessor's to
dead-letter). Those of the other inputs are dead-lettered once by the worker that owns their
partition (``agents/keeping.py``), and counted here only.

**The broker.** One that does not answer is said once, in one line, then probed quietly with a
jittered back-off (``why_unreachable``); a connection lost later (deliveries time out, fetches go
unanswered) is closed and made again the same way, the state kept, the reading resumed where
it stopped (from the start of a log that started again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import KafkaError

from agents.policy.planners.contract import FleetState, Plan, Planner, PoolKey
from infra import metrics
from infra.errors import first_line
from infra.kafka.broker import ensure_topics_async, why_unreachable
from infra.kafka.clients import LogWatch, partition_reader, send_event, start_client
from infra.kafka.connection import KafkaConnection
from planner.fleet_state import FleetFold
from schemas import topics
from schemas.codec import DecodeError, dead_letter, decode
from schemas.events import MAX_REASON_LENGTH, Event, ReplicaPlan
from streams.clients import stop_client

log = logging.getLogger(__name__)

INPUTS = (topics.HEARTBEATS, topics.REQUESTS, topics.ADMISSION, topics.COMPLETIONS, topics.PLANS)
"""What every planner reads whole (module docstring)."""
DEAD_LETTERED_HERE = frozenset({topics.ADMISSION.name, topics.PLANS.name})
"""The inputs no worker dead-letters: the active planner does."""
LEASE = TopicPartition(topics.PLANS.name, 0)
"""The member of the planners' group that holds it is the active planner."""
MAX_LABEL = 64  # the gauge's label values are cut to this many characters


def planners_group(app_id: str) -> str:
    """The consumer group whose member holding ``tf.plans`` partition 0 is the active planner."""
    return f"{app_id}-planner"


@dataclass(frozen=True, slots=True)
class PlannerOptions:
    """How the loop runs (seconds): a plan every ``interval_s``; at start the last
    ``history_s`` are read back; a pool's unchanged plan is sent again after
    ``keepalive_intervals`` ticks. The group's timeouts as the worker's (the embedded Tansu holds
    a join for half the rebalance timeout: keep them low there)."""

    interval_s: float
    group_id: str
    history_s: float = 600.0
    keepalive_intervals: int = 10
    partitions: int = 4
    session_timeout_s: float = 6.0
    rebalance_timeout_s: float = 6.0
    heartbeat_interval_s: float = 1.0
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    send_timeout_s: float = 10.0  # plans not delivered by then: the broker is taken for lost
    fetch_stale_s: float = 10.0  # no fetch of the reader answered for this long: lost too
    probe_timeout_s: float = 3.0  # one probe of a broker that does not answer
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


@dataclass(slots=True)
class PlannerCounts:
    ticks: int = 0  # plans asked for, live
    replayed_events: int = 0  # events read back at start
    replayed_ticks: int = 0  # plans asked for while replaying (none published)
    published: int = 0  # ReplicaPlans this process published
    takeovers: int = 0  # times this process became the active planner
    dead_letters: int = 0  # sent to tf.dlq
    skipped: int = 0  # messages that did not decode
    reconnects: int = 0


class BrokerLost(KafkaError):  # type: ignore[misc]
    """The planner's clients no longer work with the broker (it connects again)."""


_BROKER_ERRORS = (KafkaError, OSError)  # TimeoutError is an OSError


def plans_to_publish(
    plan: Plan,
    state: FleetState,
    published: Mapping[PoolKey, ReplicaPlan],
    *,
    now_s: float,
    keepalive_s: float,
    planner: str,
    worker: str,
) -> list[ReplicaPlan]:
    """The ``ReplicaPlan``s to publish for ``plan``, given the newest plan of each pool on
    ``tf.plans`` (``published``): one per pool the plan names whose replicas differ, whose
    prefill replicas differ (``plan.prefill.get(pool)``, None where the plan does not name the
    pool), whose warm set differs (a ``None`` warm set means "unchanged": it never differs, and
    the plan sent carries the newest one's), or whose newest plan is ``keepalive_s`` old or older.
    ``plan.warm[dc]`` rides on every plan of ``dc``; a DC whose
    warm set the plan changes but none of whose pools it names gets it on its pools' newest
    plans (their replicas and prefill replicas unchanged), else on plans keeping its pools'
    current size (``state``; prefill replicas None)."""
    wanted: dict[PoolKey, tuple[int, int | None, tuple[str, ...] | None, str]] = {}
    warm = plan.warm or {}
    for key, replicas in plan.replicas.items():
        prefill = plan.prefill.get(key)
        wanted[key] = (
            int(replicas),
            None if prefill is None else int(prefill),
            warm.get(key[2]),
            plan.reasons.get(key, ""),
        )
    named_dcs = {dc for (_, _, dc) in wanted}
    for dc, staged in warm.items():
        if dc in named_dcs:
            continue
        carriers = {key: (p.replicas, p.prefill_replicas) for key, p in published.items() if key[2] == dc}
        if not carriers:
            carriers = {pool.key: (pool.replicas, None) for pool in state.pools if pool.dc == dc}
        for key, (replicas, prefill) in carriers.items():
            wanted[key] = (replicas, prefill, staged, "warm set changed; replicas unchanged")
    out = []
    for key, (replicas, prefill, models, reason) in sorted(wanted.items()):
        newest = published.get(key)
        if newest is not None:
            same = (
                newest.replicas == replicas
                and newest.prefill_replicas == prefill
                and (models is None or newest.warm == tuple(models))
            )
            if same and now_s - newest.ts < keepalive_s:
                continue  # unchanged, and not due for a keep-alive
            if models is None:
                models = newest.warm  # the warm set stays as the newest plan had it
        model, version, dc = key
        out.append(
            ReplicaPlan(
                planner=planner,
                model=model,
                model_version=version,
                dc=dc,
                replicas=replicas,
                prefill_replicas=prefill,
                warm=None if models is None else tuple(models),
                reason=reason[:MAX_REASON_LENGTH],
                worker=worker,
            )
        )
    return out


class _Lease(ConsumerRebalanceListener):  # type: ignore[misc]
    """The planners' group as a lease: ``state`` is ``active`` while this member holds
    ``LEASE``, ``standby`` while it holds other partitions or none, ``rebalancing`` between a
    revocation and the next assignment (nobody publishes then)."""

    def __init__(self) -> None:
        self.consumer: Any = None
        self.state = "rebalancing"

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.state = "rebalancing"

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.state = "active" if LEASE in assigned else "standby"
        if assigned and self.consumer is not None:
            self.consumer.pause(*assigned)  # a lease, not a reader: nothing is fetched


async def run_planner(
    connection: KafkaConnection,
    planner: Planner,
    fold: FleetFold,
    options: PlannerOptions,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> PlannerCounts:
    """Plan until ``stop`` is set (or the task is cancelled); the module docstring says how.
    ``ready`` is set once the state is rebuilt and the clients work (cleared while the broker is
    lost). Returns what it did."""
    stop = stop or asyncio.Event()
    loop = _Planning(planner, fold, options, ready)
    try:
        failures = 0
        while not stop.is_set():
            if not await loop.wait_for_the_broker(connection, stop):
                break
            try:
                await loop.session(connection, stop)
            except _BROKER_ERRORS as exc:
                if stop.is_set():
                    break
                failures += 1
                loop.counts.reconnects += 1
                loop.lost()
                delay = _delay(options, failures)
                log.warning(
                    "planner: lost the broker (%s); connecting again in %.1f s",
                    first_line(exc), delay, exc_info=not isinstance(exc, BrokerLost),
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            else:
                failures = 0
    finally:
        loop.step_down()
    return loop.counts


def _delay(options: PlannerOptions, failures: int) -> float:
    ceiling = min(options.backoff_max_s, options.backoff_initial_s * 2.0 ** max(0, failures - 1))
    return ceiling * random.uniform(0.5, 1.0)


class _Planning:
    """What outlives a connection: the fold, the planner and its ticks, the newest plan of each
    pool, where the reading stopped."""

    def __init__(
        self, planner: Planner, fold: FleetFold, options: PlannerOptions, ready: asyncio.Event | None
    ) -> None:
        self.planner, self.fold, self.options, self.ready = planner, fold, options, ready
        self.counts = PlannerCounts()
        self.published: dict[PoolKey, ReplicaPlan] = {}
        self.positions: dict[TopicPartition, int] = {}
        self.next_tick: float | None = None  # None: not replayed yet
        self.active = False
        self.shown: set[tuple[str, str]] = set()  # the gauge's labels this process set
        self.said_waiting = False  # the log said once that this process waits
        self.lease = _Lease()

    @property
    def interval_s(self) -> float:
        return self.options.interval_s

    @property
    def leading(self) -> bool:
        """Active, and holding the lease now (not during a rebalance, nor with the broker lost)."""
        return self.active and self.lease.state == "active"

    # -- the broker -----------------------------------------------------------------------------

    async def wait_for_the_broker(self, connection: KafkaConnection, stop: asyncio.Event) -> bool:
        """``True`` once a broker of ``connection`` answers, ``False`` if told to stop first. Said
        once when it does not, probed quietly (no client retries, no log lines) with a jittered
        back-off, said once more when it answers again."""
        down_since: float | None = None
        tries = 0
        while not stop.is_set():
            why = await asyncio.to_thread(why_unreachable, connection, self.options.probe_timeout_s)
            if why is None:
                if down_since is not None:
                    log.warning(
                        "planner: Kafka broker %s answers again (unreachable for %.0f s)",
                        connection, time.monotonic() - down_since,
                    )  # fmt: skip
                return True
            if down_since is None:
                down_since = time.monotonic()
                log.warning(
                    "planner: Kafka broker %s unreachable (%s); probing it quietly, backing off to %.0f s",
                    connection, why, self.options.backoff_max_s,
                )  # fmt: skip
            tries += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _delay(self.options, tries))
        return False

    async def session(self, connection: KafkaConnection, stop: asyncio.Event) -> None:
        """One connection: topics, clients, the state read back (first time), then the loop."""
        await ensure_topics_async(connection, self.options.partitions, timeout_s=10.0)
        async with contextlib.AsyncExitStack() as stack:
            producer = await start_client(
                lambda: AIOKafkaProducer(**connection.client_options(), request_timeout_ms=10_000),
                "planner producer",
            )
            stack.push_async_callback(stop_client, producer, 2.0)
            first = self.next_tick is None
            reader = await partition_reader(
                connection,
                INPUTS,
                self.options.history_s if first else "end",
                "planner reader",
                fetch_max_wait_ms=200,
            )
            stack.push_async_callback(stop_client, reader, 2.0)
            if first:
                await self.replay(reader)
            else:
                await self._resume(reader)
            self.lease = _Lease()
            lease = await start_client(
                lambda: AIOKafkaConsumer(
                    **connection.client_options(),
                    group_id=self.options.group_id,
                    enable_auto_commit=False,
                    auto_offset_reset="latest",
                    partition_assignment_strategy=(StickyPartitionAssignor,),
                    session_timeout_ms=int(self.options.session_timeout_s * 1000),
                    rebalance_timeout_ms=int(self.options.rebalance_timeout_s * 1000),
                    heartbeat_interval_ms=int(self.options.heartbeat_interval_s * 1000),
                ),
                "planner lease",
            )
            stack.push_async_callback(stop_client, lease, 5.0)  # leaves the group: the next takes over
            self.lease.consumer = lease
            lease.subscribe([topics.PLANS.name], listener=self.lease)
            if self.ready is not None:
                self.ready.set()
            await self.run(stop, producer, lease, reader)

    def lost(self) -> None:
        """The broker is lost: not ready, not active (the lease is gone with the connection)."""
        if self.ready is not None:
            self.ready.clear()
        self.lease.state = "rebalancing"

    # -- reading --------------------------------------------------------------------------------

    async def replay(self, reader: Any) -> None:
        """Read back what the reader holds up to the ends of now (the last ``history_s``), in
        timestamp order, with a plan (not published) at every tick of the window."""
        partitions = sorted(reader.assignment())
        ends = await reader.end_offsets(partitions)
        left = {tp for tp in partitions if await reader.position(tp) < ends[tp]}
        events: list[Event] = []
        deadline = time.monotonic() + max(60.0, self.options.fetch_stale_s)
        while left:
            batches = await reader.getmany(timeout_ms=500, max_records=5000)
            if batches:
                deadline = time.monotonic() + max(60.0, self.options.fetch_stale_s)
            elif time.monotonic() > deadline:
                raise BrokerLost("reading back the topics made no progress")
            for tp, records in batches.items():
                for record in records:
                    event = self._decode(tp.topic, record.value)
                    if event is not None:
                        events.append(event)
                if records and records[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
        for tp in partitions:  # where a reconnect reads on from, read or not
            self.positions[tp] = await reader.position(tp)
        now = time.time()
        events.sort(key=lambda e: e.ts)
        start = now - self.options.history_s
        self.fold.open_window(start)
        tick = math.ceil(start / self.interval_s) * self.interval_s
        for event in events:
            while event.ts >= tick and tick <= now:
                self._plan(tick)
                self.counts.replayed_ticks += 1
                tick += self.interval_s
            self._fold(event)
        while tick <= now:
            self._plan(tick)
            self.counts.replayed_ticks += 1
            tick += self.interval_s
        self.next_tick = tick
        self.counts.replayed_events = len(events)
        log.warning(
            "planner %s: state rebuilt from the last %.0f s of the topics (%d events, %d plans replayed, "
            "%d pools planned before)",
            self.planner.name, self.options.history_s, len(events), self.counts.replayed_ticks,
            len(self.published),
        )  # fmt: skip

    async def _resume(self, reader: Any) -> None:
        """After a reconnect: read on from where the last connection stopped (from the start of
        a partition whose log is now shorter: the broker lost it)."""
        partitions = reader.assignment()
        ends = await reader.end_offsets(list(partitions))
        for tp in partitions:
            was = self.positions.get(tp)
            if was is None or was > ends[tp]:
                await reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, was)

    def _decode(self, topic: str, value: bytes | None) -> Event | None:
        try:
            return decode(_KINDS[topic], value)
        except DecodeError:
            self.counts.skipped += 1
            return None

    def _fold(self, event: Event) -> None:
        self.fold.add(event)
        if isinstance(event, ReplicaPlan):
            key = (event.model, event.model_version, event.dc)
            newest = self.published.get(key)
            if newest is None or event.ts >= newest.ts:
                self.published[key] = event

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, producer: Any, lease: Any, reader: Any) -> None:
        watch = LogWatch(reader, "planner reader")
        started, stale_s = time.monotonic(), self.options.fetch_stale_s
        assert self.next_tick is not None
        while not stop.is_set():
            wait_s = min(max(self.next_tick - time.time(), 0.0), 0.5)
            batches = await reader.getmany(timeout_ms=int(wait_s * 1000), max_records=2000)
            dead = []
            for tp, records in batches.items():
                for record in records:
                    try:
                        self._fold(decode(_KINDS[tp.topic], record.value))
                    except DecodeError as exc:
                        self.counts.skipped += 1
                        if tp.topic in DEAD_LETTERED_HERE and self.leading:
                            dead.append(dead_letter(tp.topic, record.value, record.key, exc.reason))
                if records:
                    self.positions[tp] = records[-1].offset + 1
            if dead:
                await self._send(producer, topics.DLQ, dead)
                for letter in dead:
                    metrics.dlq_total.labels(topic=letter.source_topic).inc()
                self.counts.dead_letters += len(dead)
            for tp in await watch.check():
                self.positions.pop(tp, None)
            if not watch.fresh(stale_s) and time.monotonic() - started > stale_s:
                raise BrokerLost(f"no fetch of the topics answered for {stale_s:.0f} s")
            await lease.getmany(timeout_ms=0)  # serves the group (its partitions are paused)
            self._follow_the_lease()
            now = time.time()
            if now >= self.next_tick:
                plan, state = self._plan(self.next_tick)
                self.counts.ticks += 1
                if self.leading:
                    await self._publish(producer, plan, state, now)
                self.next_tick += self.interval_s
                if self.next_tick <= now:  # after a stall: the next tick ahead, not a burst of them
                    self.next_tick = math.ceil(now / self.interval_s) * self.interval_s

    def _plan(self, tick: float) -> tuple[Plan, FleetState]:
        state = self.fold.snapshot(tick)
        return self.planner.plan(state), state

    def _follow_the_lease(self) -> None:
        if self.lease.state == "active" and not self.active:
            self.active, self.said_waiting = True, False
            self.counts.takeovers += 1
            metrics.planner_active.set(1)
            log.warning(
                "planner %s: active (this process holds %s:%d of group %s)",
                self.planner.name, LEASE.topic, LEASE.partition, self.options.group_id,
            )  # fmt: skip
            self._show()
        elif self.lease.state == "standby" and (self.active or not self.said_waiting):
            self.step_down()
            self.said_waiting = True
            log.warning("planner %s: waiting (another planner is active)", self.planner.name)

    def step_down(self) -> None:
        """No longer the active planner: the gauge shows nothing of this process."""
        self.active = False
        metrics.planner_active.set(0)
        for pool, dc in self.shown:
            with contextlib.suppress(KeyError):
                metrics.desired_replicas.remove(pool, dc)
        self.shown = set()

    async def _publish(self, producer: Any, plan: Plan, state: FleetState, now: float) -> None:
        plans = plans_to_publish(
            plan,
            state,
            self.published,
            now_s=now,
            # Half an interval less: a plan's timestamp is a little after its tick, so the plan
            # of N ticks ago is a little less than N intervals old.
            keepalive_s=(self.options.keepalive_intervals - 0.5) * self.interval_s,
            planner=self.planner.name,
            worker=self.options.worker,
        )
        if plans:
            await self._send(producer, topics.PLANS, plans)
            for sent in plans:
                self.published[(sent.model, sent.model_version, sent.dc)] = sent
            self.counts.published += len(plans)
            metrics.replica_plans_total.labels(planner=self.planner.name[:MAX_LABEL]).inc(len(plans))
        self._show()

    async def _send(self, producer: Any, spec: topics.TopicSpec, events: list[Any]) -> None:
        futures = [await send_event(producer, spec, event) for event in events]
        try:
            await asyncio.wait_for(asyncio.gather(*futures), self.options.send_timeout_s)
        except TimeoutError as exc:
            raise BrokerLost(f"{spec.name}: not delivered in {self.options.send_timeout_s:.0f} s") from exc

    def _show(self) -> None:
        """The newest plan of every pool on the gauge: replicas per model and DC (versions summed)."""
        desired: dict[tuple[str, str], int] = {}
        for (model, _version, dc), plan in self.published.items():
            label = (model[:MAX_LABEL], dc[:MAX_LABEL])
            desired[label] = desired.get(label, 0) + plan.replicas
        for pool, dc in self.shown - desired.keys():
            with contextlib.suppress(KeyError):
                metrics.desired_replicas.remove(pool, dc)
        for (pool, dc), replicas in desired.items():
            metrics.desired_replicas.labels(pool=pool, dc=dc).set(replicas)
        self.shown = set(desired)


_KINDS: dict[str, type[Event]] = {spec.name: spec.event for spec in INPUTS}
