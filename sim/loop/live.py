"""The simulator's instance engines driven in (scaled) wall-clock time, for the emulated fleet.

Pure: no Kafka, no clock reads. The caller passes wall times (``time.time()``); emulated time is
``(wall - start_wall) * speed``, where ``start_wall`` is fixed at construction or at the first
call. Every wall time of the outside world (a request's arrival ``ts``, its ``deadline_ts``) maps
through the same affine map, so at ``speed`` X the instances run X times faster than the clock
and a delay in the pipeline in front of the fleet costs X emulated seconds of TTFT.

Reported durations (TTFT, TPOT, E2E) are emulated seconds, counted from the request's arrival at
the scheduler (its ``ts``). Event timestamps (``ts``) are the wall time the event happened at.

Each attempt that runs reports its first token (a ``ResponseStarted``, as a proxy sees the
response start streaming) before its ``Completion``.

An attempt's life on its instance (step ends, first tokens, give-ups, ends, what it reports) is
``sim/loop/lifecycle.py``'s, as in the discrete-event loop (``sim/loop/runner.py``), and so are
the clients' rules (``sim/loop/clients.py``): without a first token within the class's
``client_timeout_s`` (or, for deadline classes, by the deadline) the attempt is aborted where it
is and its completion says ``timeout``. Retries are not emulated here: they are the client's.
An explicit ``abort`` (the client hung up) ends the attempt the same way, as ``aborted``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from itertools import count

from agents.policy.common.slo import DEFAULT_SLO_CLASSES, SloClass, classify
from agents.policy.common.timing import clamp_duration
from agents.policy.types import BLOCK_TOKENS
from schemas.events import MAX_DURATION_S, Completion, Heartbeat, KvEvent, ResponseStarted, RoutingDecision
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.engine.instance import Instance
from sim.loop.clients import ClientRules
from sim.loop.lifecycle import AttemptLifecycle, Measures
from sim.workloads.trace import TraceRequest

InstanceEvent = ResponseStarted | Completion | KvEvent
"""What the emulated instances report: first tokens, completions, KV events (not the wire's
``schemas.events.FleetEvent``, FleetMind's notices)."""

_STEP_END, _TIMEOUT = 0, 1
_Entry = tuple[float, int, int, Instance | Attempt, int]  # time, kind, tie-break, payload, version
# Converting an emulated time to wall time and back may land a hair before it; a caller that
# slept until ``next_wakeup`` must still see that event processed.
_EPSILON_S = 1e-6
# Redeliveries come soon after the original (a rebalance), so a bounded memory suffices.
_REMEMBERED_DECISIONS = 100_000


class LiveFleet(AttemptLifecycle):
    """The fleet's engines in real time. Call ``submit`` for decisions, ``abort`` for clients
    that hang up, ``advance`` when woken.

    ``submit``, ``abort`` and ``heartbeats`` first catch up to their ``now_wall``; events produced
    meanwhile are returned by the next ``advance``. Wall times passed in must not go backwards.
    """

    def __init__(
        self,
        fleet: FleetSpec,
        speed: float = 1.0,
        start_wall: float | None = None,
        slo_classes: dict[str, SloClass] | None = None,
        output_tokens: Mapping[str, int] | None = None,
    ) -> None:
        """``output_tokens``: how long each answer is, by request id (the workload's lengths, as
        the load generator names its requests); a request not in it generates its whole
        ``output_budget``. The length never travels on the bus: it is not part of a request."""
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.fleet = fleet
        self.output_tokens: Mapping[str, int] = output_tokens or {}
        self.speed = speed
        self.start_wall = start_wall
        self.slo_classes = dict(DEFAULT_SLO_CLASSES if slo_classes is None else slo_classes)
        self.clients = ClientRules(self.slo_classes)  # no retries: those are the real client's
        window = (0.0, float("inf"))
        self.instances = {
            spec.instance_id: Instance(spec, window, kv_events=True) for spec in fleet.instances
        }
        self._heap: list[_Entry] = []
        self._seq = count()
        self._pending: list[InstanceEvent] = []
        self._open: dict[Attempt, RoutingDecision] = {}  # attempts submitted and not yet ended
        # Open attempts by (request id, attempt number), for ``abort`` (one each: ``submit`` runs
        # an attempt once).
        self._by_key: dict[tuple[str, int], Attempt] = {}
        self._cancelled: set[Attempt] = set()  # open attempts ``abort`` is ending
        self._seen: set[tuple[str, int]] = set()  # (request id, attempt) of every decision run
        self._seen_order: deque[tuple[str, int]] = deque()

    # --- clock ----------------------------------------------------------------------------------

    def sim_time(self, wall: float) -> float:
        """Emulated seconds at wall time ``wall`` (starts the clock on first use)."""
        if self.start_wall is None:
            self.start_wall = wall
        return (wall - self.start_wall) * self.speed

    def wall_time(self, sim_s: float) -> float:
        start = 0.0 if self.start_wall is None else self.start_wall
        return start + sim_s / self.speed

    # --- inputs ---------------------------------------------------------------------------------

    def submit(self, decision: RoutingDecision, now_wall: float, output_tokens: int | None = None) -> bool:
        """Run the decision's request on the named instance (unknown or too big: an error
        completion; already past its client timeout: a timeout completion, never enqueued).
        ``output_tokens``: how long its answer is (None: as ``output_tokens`` at construction
        says, else its whole budget).

        Returns False, doing nothing, for a decision about an attempt seen before (same request
        id and attempt, whatever its ``event_id``): the bus delivers at least once, a scheduler
        may decide a redelivered request again, and a request must never run twice.
        """
        key = (decision.request_id, decision.attempt)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._seen_order.append(key)
        if len(self._seen_order) > _REMEMBERED_DECISIONS:
            self._seen.discard(self._seen_order.popleft())
        now = self.sim_time(now_wall)
        self._catch_up(now)
        request = decision.request
        attempt = Attempt(
            self._trace_request(decision, output_tokens),
            decision.attempt,
            self.sim_time(request.ts),
            request.output_budget,
        )
        instance = self.instances.get(decision.instance_id)
        if instance is None or not instance.fits_ever(attempt):
            attempt.status = "rejected"
            self._pending.append(self._completion(attempt, decision, now))
            return True
        give_up = self._timeout_at(attempt, request.deadline_ts)
        if give_up is not None and give_up <= now:
            attempt.status = "aborted"
            self._pending.append(self._completion(attempt, decision, now))
            return True
        self._open[attempt] = decision
        self._by_key[key] = attempt
        instance.enqueue(attempt, now)
        self._after(instance, now)
        if give_up is not None:
            self._push(give_up, _TIMEOUT, attempt, 0)
        return True

    def abort(self, request_id: str, attempt: int, now_wall: float) -> bool:
        """The client hangs up on attempt ``attempt`` of ``request_id``: waiting, it leaves at
        once; running, it ends at the end of the step in progress (a first token not yet seen is
        never reported). Its completion says ``aborted``.

        Returns False, doing nothing, when no such attempt is open: never submitted, ended by
        ``now_wall``, or already being given up on (that one's completion says ``timeout``).
        """
        now = self.sim_time(now_wall)
        self._catch_up(now)
        open_attempt = self._by_key.get((request_id, attempt))
        if open_attempt is None or open_attempt.abort_requested:
            return False
        self._cancelled.add(open_attempt)
        self._give_up(open_attempt, now)
        return True

    def advance(self, now_wall: float) -> list[InstanceEvent]:
        """Process every step end and client give-up up to ``now_wall``; return the first
        tokens, completions and KV events produced since the last call, in time order (an
        attempt's first token before its completion)."""
        self._catch_up(self.sim_time(now_wall))
        events, self._pending = self._pending, []
        return events

    # --- observation ----------------------------------------------------------------------------

    def tokens_generated(self, request_id: str, attempt: int, now_wall: float) -> int | None:
        """Output tokens open attempt ``attempt`` of ``request_id`` has generated by ``now_wall``
        (mid macro-step included: what a client reading its stream has had); None: not open."""
        now = self.sim_time(now_wall)
        self._catch_up(now)
        open_attempt = self._by_key.get((request_id, attempt))
        if open_attempt is None or open_attempt.instance is None:
            return None
        return open_attempt.instance.tokens_so_far(open_attempt, now)

    def heartbeats(self, now_wall: float) -> list[Heartbeat]:
        """Every instance's report at ``now_wall`` (mid macro-step counts included)."""
        now = self.sim_time(now_wall)
        self._catch_up(now)
        beats = []
        for instance in self.instances.values():
            waiting, running, tokens, kv_used = instance.heartbeat(now)
            spec = instance.spec
            beats.append(
                Heartbeat(
                    ts=now_wall,
                    instance_id=spec.instance_id,
                    dc=spec.dc,
                    model=spec.model,
                    model_version=spec.version,
                    profile=spec.profile.name,
                    waiting=waiting,
                    running=running,
                    tokens_in_flight=tokens,
                    kv_blocks_used=kv_used,
                    kv_blocks_total=instance.kv_blocks_total,
                    prefix_cache_queries=instance.prefix_cache_queries,
                    prefix_cache_hits=instance.prefix_cache_hits,
                    preemptions=instance.preemptions,
                    gpus=spec.profile.gpus,
                    price_per_hour=spec.price,
                    kv_block_tokens=spec.profile.kv_block_tokens,
                    max_seqs=spec.profile.max_seqs,
                    prefill_budget_tokens=spec.profile.prefill_budget_tokens,
                )
            )
        return beats

    def next_wakeup(self, now_wall: float) -> float | None:
        """Wall time of the next step end or give-up (never before ``now_wall``); None if idle."""
        heap = self._heap
        while heap and self._stale(heap[0][3], heap[0][4]):
            heapq.heappop(heap)
        if not heap:
            return None
        return max(self.wall_time(heap[0][0]), now_wall)

    @property
    def open_attempts(self) -> int:
        """Attempts submitted and not yet ended."""
        return len(self._open)

    # --- the event loop -------------------------------------------------------------------------

    def _catch_up(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now + _EPSILON_S:
            time_s, kind, _, payload, version = heapq.heappop(heap)
            if self._stale(payload, version):
                continue
            if kind == _STEP_END:
                assert isinstance(payload, Instance)
                self._step_ended(payload, time_s)
            else:
                assert isinstance(payload, Attempt)
                self._give_up(payload, time_s)

    def _stale(self, payload: Instance | Attempt, version: int) -> bool:
        """A step end superseded by a later plan, or a give-up that no longer applies."""
        if isinstance(payload, Instance):
            return not payload.scheduled or payload.version != version
        return not self._gives_up(payload)

    def _give_up(self, attempt: Attempt, now: float) -> None:
        """The client stops waiting for ``attempt`` (its timeout, or ``abort``)."""
        assert attempt.instance is not None
        self._abort_on(attempt, attempt.instance, now)

    def _push(self, time_s: float, kind: int, payload: Instance | Attempt, version: int) -> None:
        heapq.heappush(self._heap, (time_s, kind, next(self._seq), payload, version))

    # --- an attempt's life: ``AttemptLifecycle``'s hooks ----------------------------------------

    def _after(self, instance: Instance, now: float) -> None:
        """Schedule the instance's next step end and collect its KV events."""
        if instance.scheduled:
            self._push(instance.step_end_s, _STEP_END, instance, instance.version)
        if instance.cache.events:
            spec = instance.spec
            ts = self.wall_time(now)
            for kind, blocks in instance.cache.events:
                self._pending.append(
                    KvEvent(
                        ts=ts, instance_id=spec.instance_id, model=spec.model, kind=kind, block_hashes=blocks
                    )
                )
            instance.cache.events.clear()

    def _started(self, instance: Instance, attempt: Attempt, ttft_s: float, now: float) -> None:
        decision = self._open[attempt]
        self._pending.append(
            ResponseStarted(
                ts=self.wall_time(now),
                request_id=decision.request.request_id,
                attempt=decision.attempt,
                instance_id=decision.instance_id,
                model=decision.request.model,
                ttft_s=_duration(ttft_s),
            )
        )

    def _ended(self, attempt: Attempt, now: float) -> None:
        decision = self._open.pop(attempt)
        del self._by_key[(decision.request_id, decision.attempt)]
        self._pending.append(self._completion(attempt, decision, now))
        self._cancelled.discard(attempt)

    # --- conversions ----------------------------------------------------------------------------

    def _trace_request(self, decision: RoutingDecision, output_tokens: int | None) -> TraceRequest:
        request = decision.request
        if output_tokens is None:
            output_tokens = self.output_tokens.get(request.request_id, request.output_budget)
        deadline_s = None
        if request.deadline_ts is not None:
            deadline_s = (request.deadline_ts - request.ts) * self.speed
        return TraceRequest(
            request_id=request.request_id,
            arrival_s=self.sim_time(request.ts),
            input_tokens=request.input_tokens,
            output_tokens=output_tokens,
            # Already chained by the client; never more than the prompt's full blocks, or the
            # engine's KV reservation (prompt + budget) would not cover them.
            block_hashes=request.prompt_block_hashes[: request.input_tokens // BLOCK_TOKENS],
            tenant=request.tenant,
            slo_class=decision.slo_class or classify(request.input_tokens, request.slo_class),
            deadline_s=deadline_s,
            max_tokens=request.output_budget,
            task_type=request.task_type,
            model=request.model,
        )

    def _timeout_at(self, attempt: Attempt, deadline_ts: float | None) -> float | None:
        """Emulated time the client gives up at (None: it waits for ever)."""
        deadline = None if deadline_ts is None else self.sim_time(deadline_ts)
        return self.clients.give_up_at(attempt, deadline)

    def _completion(self, attempt: Attempt, decision: RoutingDecision, now: float) -> Completion:
        """The completion of ``attempt``: ended on its instance at ``now``, or never run there
        (refused, or given up on before it was sent: no E2E)."""
        request = decision.request
        measures = Measures.of(attempt)
        ttft, tpot, e2e = (
            None if d is None else _duration(d) for d in (measures.ttft_s, measures.tpot_s, measures.e2e_s)
        )
        return Completion(
            ts=self.wall_time(now),
            request_id=request.request_id,
            attempt=decision.attempt,
            instance_id=decision.instance_id,
            model=request.model,
            tenant=request.tenant,
            slo_class=attempt.request.slo_class,
            status="aborted" if attempt in self._cancelled else measures.status,
            arrival_ts=request.ts,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=e2e,
            input_tokens=request.input_tokens,
            cached_tokens=attempt.cached_tokens,
            output_tokens=attempt.generated,
            deadline_ts=request.deadline_ts,
        )


def _duration(seconds: float) -> float:
    """A reported duration within what the events accept: a request that arrived long before the
    fleet started (a replayed log) reports the longest duration, not an invalid event."""
    return clamp_duration(seconds, MAX_DURATION_S)
