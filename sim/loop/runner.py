"""The discrete-event runner: one policy, one workload, one fleet, simulated to the end.

Events, in time order (ties: step ends, then arrivals, then client timeouts, then heartbeats):
- arrival of a request attempt: the scheduler decides (admit / queue / reject) on the latest
  heartbeat snapshot; an admitted attempt joins the instance it was placed on; a closed-loop
  call arrives after its session's previous call ended for its client (``sessions.py``);
- step end of an instance: tokens are produced, finished attempts complete;
- client timeout: the client gives up (no first token in time, or batch deadline passed); the
  attempt is aborted where it is; a share of interactive give-ups is retried once;
- heartbeat: every instance reports (what a metrics scrape reads at that instant);
- signal: after ``signal_delay_s``, a heartbeat round reaches the scheduler — its next decisions
  see this snapshot (a new version, stamped with the time it was *taken*) and the requests it
  holds are offered again (``Scheduler.tick``) — and so do the KV events an instance emitted;
- dispatch (fleets of several DCs): an attempt sent to a DC at round trip r from the ingress
  reaches its instance r/2 later, and what it streams back reaches the client r/2 after the
  instance produced it (TTFT and E2E are taken at the client, network included);
- plan, ready, drain check (a planner other than ``static``): the fleet's shape changes
  (``sim/loop/shaping.py``): replicas start with an empty cache, serve once loaded, drain and
  stop; what reaches a stopped one fails (lost in scale-down);
- transferred (a disaggregated request, ``sim/loop/disagg.py``): its KV cache reached its decode
  instance after its prefill leg, and it joins that instance;
- outage (``FleetSpec.outages``): a DC goes down — what its instances run fails (the client
  retries it at once), they stop heartbeating (the scheduler keeps their last row, ageing) and
  whatever reaches them fails — and comes back later with cold caches.

What happens to an attempt on its instance (step ends, first tokens, give-ups, ends and what
an ended attempt reports) is ``sim/loop/lifecycle.py``'s, shared with the real-time driver
(``sim/loop/live.py``).

Every admit is recorded as a ``Send`` (which instance, DC, model and version it went to, when,
and how the scheduler's newest row of that instance looked then), so that violations can be
judged afterwards from the truth and the fleet file, for every policy alike, by a judge that
shares nothing with the policies (``sim/evaluation/violations.py``).

Several deciders per pool (``SimConfig.deciders`` > 1): the runner drives ``Deciders``
(``sim/loop/deciders.py``) instead of one scheduler: N schedulers, each deciding its partition's
requests and reading the others' placements from the decision log ``decision_log_delay_s`` late.

The scheduler sees request views, snapshots, its own decisions, first tokens, completions and
(if a stage asks) KV events; never the true output length. Snapshots and KV events are late by
the same ``signal_delay_s`` for every policy (a scrape's and an event bus's delay); first tokens
and completions are not (a router that proxies the response sees them as they happen).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from itertools import count
from typing import cast

import numpy as np

from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.planners import Planner
from agents.policy.registry import StageParams
from agents.policy.types import (
    BlocksChanged,
    ClusterView,
    Finished,
    FirstToken,
    Outcome,
    PrefillDone,
)
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.engine.instance import Instance
from sim.engine.profiles import EngineOptions
from sim.loop.config import SimConfig
from sim.loop.deciders import PoolDecider, pool_decider_for
from sim.loop.disagg import KvLinks, PairedLegs
from sim.loop.feedback import EndedAttempt, MemoryOutcomes, OutcomeSink, bind_feedback
from sim.loop.lifecycle import AttemptLifecycle, Measures, deadline_at, met_objective
from sim.loop.results import RunResult, Send
from sim.loop.sessions import Sessions
from sim.loop.shaping import FleetShaper
from sim.loop.views import dc_view, request_view
from sim.workloads.trace import TraceRequest, Workload

(
    _STEP_END,
    _WINDOW_END,
    _ARRIVAL,
    _TIMEOUT,
    _HEARTBEAT,
    _SIGNAL,
    _DISPATCH,
    _OUTAGE,
    _WAKE,
    _PLAN,
    _READY,
    _DRAIN_CHECK,
    _SAMPLE,
    _TRANSFERRED,
) = range(14)
MAX_FAILURE_RETRIES = 2
"""Attempts a client adds after its request failed with its DC (a gateway retries at once)."""


ProgressFn = Callable[[int], None]


class Simulation(AttemptLifecycle, PairedLegs):
    """The discrete-event loop (module docstring); an attempt's life on its instance is
    ``AttemptLifecycle``'s, a disaggregated request's legs ``PairedLegs``'."""

    def __init__(
        self,
        workload: Workload,
        fleet: FleetSpec,
        scheduler: PoolDecider,
        config: SimConfig,
        feedback: OutcomeSink | None = None,
        planner: Planner | None = None,
    ) -> None:
        """``feedback``: where ended attempts and rejects are recorded for an admission stage
        that closes its loop on them (default: in memory, if the stage wants feedback).
        ``planner``: who shapes the fleet (``sim/loop/shaping.py``; default ``static``, the
        fleet as listed). ``ValueError`` if a request names an SLO class ``config`` does not have."""
        unknown = sorted({r.slo_class for r in workload.requests} - set(config.slo_classes))
        if unknown:
            raise ValueError(
                f"{workload.name}: SLO class {unknown[0]!r} is not configured "
                f"(classes: {', '.join(sorted(config.slo_classes))})"
            )
        self.workload = workload
        self.scheduler = scheduler
        self.config = config
        self.clients = config.clients()
        arrivals = [r.arrival_s for r in workload.requests]
        self.window = (min(arrivals), max(arrivals))
        self.shaper = FleetShaper(planner, fleet, self.window, config)
        fleet = self.fleet = self.shaper.fleet
        kv_events = scheduler.wants_kv_events
        self.instances = [
            Instance(spec, self.window, kv_events, self._engine_options(spec.profile.options))
            for spec in fleet.instances
        ]
        self._index_of = {instance: index for index, instance in enumerate(self.instances)}
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = count()
        self._wake_s: float | None = None  # when the scheduler was last asked to be woken
        self._attempts: list[Attempt] = []
        self._open = 0
        self._arrivals_left = 0  # first attempts on their way (``_send``), not yet arrived
        self.sessions = Sessions.of(workload.requests)  # the closed-loop ones it holds back
        self._offered: dict[tuple[str, int], Attempt] = {}  # attempts the scheduler holds or decides
        self._versions = count(1)
        self._dcs = dc_view(fleet)
        self._down: set[int] = set()  # instances of a DC that is down
        self._last_beat: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(self.instances)
        self._beat_s = np.zeros(len(self.instances))
        self._row_dc = [spec.dc for spec in fleet.instances]
        self.sends: list[Send] = []
        self.notices: list[FleetNotice] = []
        self._slot_of_id = {spec.instance_id: index for index, spec in enumerate(fleet.instances)}
        self._view = self._snapshot(0.0)
        self._view_slots = self._slots_of(self._view)
        self.feedback = bind_feedback(scheduler, feedback or MemoryOutcomes())
        self.links = KvLinks(fleet)
        self._pairs = {}

    def _engine_options(self, own: EngineOptions) -> EngineOptions:
        """The configured engine options, else the profile's; noise seeded by the run's seed."""
        return self.config.engine or replace(own, noise_seed=self.config.seed)

    def run(self, progress: ProgressFn | None = None) -> RunResult:
        for request in self.sessions.first:
            self._send(request, request.arrival_s)
        for outage in self.fleet.outages:
            self._push(self.window[0] + outage.down_s, _OUTAGE, (outage.dc, True))
            self._push(self.window[0] + outage.up_s, _OUTAGE, (outage.dc, False))
        self._push(self.window[0], _HEARTBEAT, None)
        self._push(self.window[1], _WINDOW_END, None)
        self._push(self.window[0], _SAMPLE, None)
        if self.shaper.plans:
            self._push(self.window[0], _PLAN, None)
        done = 0
        while self._heap:
            now, kind, _, payload = heapq.heappop(self._heap)
            if kind == _STEP_END:
                index, engine, version = cast(tuple[int, Instance, int], payload)
                instance = self.instances[index]
                if instance is engine and instance.version == version and instance.scheduled:
                    self._step_ended(instance, now)
            elif kind == _ARRIVAL:
                # Arrivals at one instant reach the router together (a real router reads its
                # input in batches too), so a policy may decide a burst as a whole.
                burst = [cast(Attempt, payload)]
                while self._heap and self._heap[0][0] == now and self._heap[0][1] == _ARRIVAL:
                    burst.append(cast(Attempt, heapq.heappop(self._heap)[3]))
                self._arrive(burst, now)
                done += len(burst)
                if progress is not None and done // 256 > (done - len(burst)) // 256:
                    progress(done)
            elif kind == _WINDOW_END:
                self._close_window(now)
            elif kind == _TIMEOUT:
                self._give_up(cast(Attempt, payload), now)
            elif kind == _HEARTBEAT:
                self._heartbeat(now)
            elif kind == _DISPATCH:
                self._reach(*cast(tuple[Attempt, int, Instance], payload), now)
            elif kind == _OUTAGE:
                self._outage(*cast(tuple[str, bool], payload), now)
            elif kind == _WAKE:  # a deferred request is due (several deciders)
                self._wake_s = None
                self._apply(self.scheduler.tick(self._view, now), now)
            elif kind == _PLAN:
                self._plan(now)
            elif kind == _READY:
                self.shaper.replicas.became_ready(cast(int, payload), now)
            elif kind == _DRAIN_CHECK:
                self._stop_if_done(cast(int, payload), now)
            elif kind == _TRANSFERRED:
                self._transferred(*cast(tuple[Attempt, int, Instance], payload), now)
            elif kind == _SAMPLE:
                self.shaper.replicas.sample(now)
                if now + self.shaper.replicas.timeline_step_s <= self.window[1]:
                    self._push(now + self.shaper.replicas.timeline_step_s, _SAMPLE, None)
            else:
                self._deliver(cast(ClusterView | list[BlocksChanged], payload), now)
        if progress is not None:
            progress(done)
        busy = [i.busy_s for i in self.instances]
        return RunResult(
            self.scheduler.name,
            self._attempts,
            self.window,
            busy,
            self.sends,
            self.notices,
            self.shaper.held_s(),
            self.fleet.instances,
            self.shaper.planner.name,
            self.shaper.figures(),
            self.links.figures(),
        )

    # --- event handlers -----------------------------------------------------------------------

    def _send(self, request: TraceRequest, at_s: float) -> None:
        """``request``'s first attempt arrives at ``at_s``."""
        self._push(at_s, _ARRIVAL, Attempt(request, 1, at_s, self.config.budget_for(request)))
        self._arrivals_left += 1

    def _more_to_come(self) -> bool:
        return self._open > 0 or self._arrivals_left > 0 or self.sessions.held > 0

    def _arrive(self, attempts: list[Attempt], now: float) -> None:
        for attempt in attempts:
            if attempt.attempt == 1:
                self._arrivals_left -= 1
                self.shaper.arrived(attempt, now)
            self._attempts.append(attempt)
            self._open += 1
            timeout = self._timeout_at(attempt)
            if timeout is not None:
                self._push(timeout, _TIMEOUT, attempt)
        self._offer(attempts, now)

    def _offer(self, attempts: list[Attempt], now: float) -> None:
        views = []
        for attempt in attempts:
            view = request_view(attempt, self.fleet.default_model)
            self._offered[view.key] = attempt
            views.append(view)
        self._apply(self.scheduler.submit(views, self._view, now), now)

    def _apply(self, outcomes: list[Outcome], now: float) -> None:
        for outcome in outcomes:
            if outcome.action != "queue":
                self._settle(self._offered.pop(outcome.request.key), outcome, now)
            else:
                self.shaper.held(self._offered[outcome.request.key].request)
        self.notices += self.scheduler.notices()
        wake = self.scheduler.next_wake_s()
        if wake is not None and (self._wake_s is None or wake < self._wake_s):
            self._wake_s = wake
            self._push(wake, _WAKE, None)

    def _settle(self, attempt: Attempt, outcome: Outcome, now: float) -> None:
        attempt.predicted_ttft_s = outcome.predicted_ttft_s
        if outcome.action == "admit":
            index = self._view_slots[outcome.instance]
            self._record_send(attempt, index, outcome.instance, now)
            attempt.dc, attempt.sent_s = self._row_dc[index], now
            attempt.return_s = self.fleet.rtt(self.fleet.ingress_dc, attempt.dc) / 2
            if outcome.prefill_instance >= 0:
                self._send_pair(attempt, outcome, index, now)
            else:
                self._dispatch(attempt, index, now)
            return
        if self.feedback is not None:
            self.feedback.rejected(now, attempt.request.slo_class)
        self.shaper.rejected(attempt.request)
        attempt.status = "rejected"
        self._end(attempt, now)

    def _dispatch(self, attempt: Attempt, index: int, now: float) -> None:
        """Send ``attempt`` to instance ``index``: it reaches it r/2 later (``return_s``)."""
        instance = self.instances[index]
        if attempt.return_s > 0:
            self._push(now + attempt.return_s, _DISPATCH, (attempt, index, instance))
        else:
            self._reach(attempt, index, instance, now)

    def _reach(self, attempt: Attempt, index: int, instance: Instance, now: float) -> None:
        """The attempt reaches the instance it was sent to (``now``: dispatch time + r/2)."""
        if attempt.status != "pending":
            return  # its client gave up while it travelled
        if index in self._down or self.instances[index] is not instance:
            if index not in self._down:  # its replica stopped, or started again, meanwhile
                self.shaper.replicas.lost_in_scale_down += 1
            attempt.instance = instance
            self._fail(attempt, now)
            return
        if instance.fits_ever(attempt):
            instance.enqueue(attempt, now)
            self._after(instance, now)
            return
        attempt.instance = instance  # the engine refuses it; the router sees an error
        attempt.status = "rejected"
        self._end(attempt, now)

    def _record_send(self, attempt: Attempt, index: int, row: int, now: float) -> None:
        """The admit to instance ``index`` (row ``row`` of the view) as it happened (``Send``):
        judged later, never here, so that no policy's own reading of the rules decides whether
        it broke them."""
        spec = self.fleet.instances[index]
        view = self._view
        self.sends.append(
            Send(
                attempt.request,
                attempt.attempt,
                now,
                spec.instance_id,
                spec.dc,
                spec.model,
                spec.version,
                bool(view.ready[row]),
                float(view.last_heartbeat_s[row]),
            )
        )

    def _fail(self, attempt: Attempt, now: float) -> None:
        """The attempt failed with its DC; the client learns it r/2 later and retries."""
        attempt.status = "failed"
        attempt.retried = attempt.client is None and attempt.attempt <= MAX_FAILURE_RETRIES
        self._end(attempt, now)
        if attempt.retried:  # (a leg: its client retries)
            back = now + attempt.return_s
            self._push(
                back, _ARRIVAL, Attempt(attempt.request, attempt.attempt + 1, back, attempt.output_budget)
            )

    def _outage(self, dc: str, down: bool, now: float) -> None:
        """DC ``dc`` goes down (its instances fail what they hold and come back cold) or up."""
        for index, spec in enumerate(self.fleet.instances):
            if spec.dc != dc:
                continue
            if not down:
                self._down.discard(index)
                continue
            self._down.add(index)
            old = self.instances[index]
            held = [*old.waiting, *old.running]
            self._fresh_instance(index)
            for attempt in held:
                if attempt.status == "pending":
                    self._fail(attempt, now)

    def _plan(self, now: float) -> None:
        """Ask the planner for the fleet's shape and converge to it."""
        self.shaper.plan(now, self._view, self._view_slots)
        self._converge(now)
        if self._more_to_come():
            self._push(now + self.shaper.planner.interval_s, _PLAN, None)

    def _converge(self, now: float) -> None:
        """Start and drain replicas towards the plan (``Replicas.converge``)."""
        loads = [instance.tokens_in_flight for instance in self.instances]
        starts, drains = self.shaper.replicas.converge(now, loads)
        for index, ready_s in starts:
            self._fresh_instance(index)
            self._push(ready_s, _READY, index)
        for index in drains:
            self._push(now + self.shaper.replicas.grace_s, _DRAIN_CHECK, index)

    def _stop_if_done(self, index: int, now: float) -> None:
        """A draining replica that runs nothing stops once its grace has passed; its GPUs
        free, the plan may start others."""
        instance = self.instances[index]
        idle = not instance.waiting and not instance.running
        if self.shaper.replicas.stop_if_done(index, idle, now):
            self._fresh_instance(index)
            self._last_beat[index] = (0, 0, 0, 0)
            self._converge(now)

    def _fresh_instance(self, index: int) -> None:
        """Row ``index`` gets a new engine with an empty cache (what reaches the old one fails)."""
        old = self.instances[index]
        fresh = Instance(
            self.fleet.instances[index], self.window, self.scheduler.wants_kv_events, old.options
        )
        fresh.busy_s = old.busy_s
        self.instances[index] = fresh
        del self._index_of[old]
        self._index_of[fresh] = index

    def _give_up(self, attempt: Attempt, now: float) -> None:
        if not self._gives_up(attempt):
            return
        attempt.retried = self.clients.retries(attempt)
        if self.scheduler.withdraw(attempt.request.request_id, attempt.attempt):
            del self._offered[(attempt.request.request_id, attempt.attempt)]
            attempt.status = "aborted"
            self._end(attempt, now)
        elif attempt.instance is None and attempt.dc:  # on its way, or in a pair's first legs
            attempt.status = "aborted"
            self._end(attempt, now)
            self._drop_leg(attempt, now)
        elif attempt.instance is not None:
            self._abort_on(attempt, attempt.instance, now)
        if attempt.retried:
            retry = Attempt(attempt.request, attempt.attempt + 1, now, attempt.output_budget)
            self._push(now, _ARRIVAL, retry)

    def _close_window(self, now: float) -> None:
        """Record how many tokens each attempt still running has generated inside the window."""
        for attempt in self._attempts:
            if attempt.status == "pending":
                instance = attempt.instance
                attempt.tokens_in_window = 0 if instance is None else instance.tokens_so_far(attempt, now)

    def _heartbeat(self, now: float) -> None:
        self._signal(self._snapshot(now), now)
        if self._more_to_come():
            self._push(now + self.config.heartbeat_s, _HEARTBEAT, None)

    def _signal(self, signal: ClusterView | list[BlocksChanged], now: float) -> None:
        """A snapshot or KV events, to reach the scheduler ``signal_delay_s`` from ``now``."""
        if self.config.signal_delay_s > 0:
            self._push(now + self.config.signal_delay_s, _SIGNAL, signal)
        else:
            self._deliver(signal, now)

    def _deliver(self, signal: ClusterView | list[BlocksChanged], now: float) -> None:
        if isinstance(signal, ClusterView):
            self._view = signal
            self._view_slots = self._slots_of(signal)
            self._apply(self.scheduler.tick(signal, now), now)
        else:
            for event in signal:
                self.scheduler.observe(event)

    # --- an attempt's life: ``AttemptLifecycle``'s hooks --------------------------------------

    def _after(self, instance: Instance, now: float) -> None:
        """Schedule the instance's next step end and forward its KV events."""
        index = self._index_of[instance]
        if instance.scheduled:
            self._push(instance.step_end_s, _STEP_END, (index, instance, instance.version))
        elif self.shaper.replicas.is_draining(index):
            self._stop_if_done(index, now)
        if instance.cache.events:
            iid = instance.spec.instance_id
            changes = [BlocksChanged(iid, kind, blocks, now) for kind, blocks in instance.cache.events]
            instance.cache.events.clear()
            self._signal(changes, now)

    def _started(self, instance: Instance, attempt: Attempt, ttft_s: float, now: float) -> None:
        """The first byte of a response that started streaming in the step just ended (not a
        prefill leg's: its token is not the client's)."""
        if attempt.client is not None:
            return
        iid = instance.spec.instance_id
        self.scheduler.observe(FirstToken(attempt.request.request_id, attempt.attempt, iid, ttft_s, now))

    def _ended(self, attempt: Attempt, now: float) -> None:
        if attempt.client is not None:
            self._prefilled(attempt, now)
            return
        self._open -= 1
        if not attempt.retried:  # the request is over for its client: its session goes on
            following = self.sessions.ended(attempt.request, now + attempt.return_s)
            if following is not None:
                self._send(*following)
        if self.shaper.plans and attempt.status != "rejected":  # rejects are counted apart
            measures = Measures.of(attempt)
            self.shaper.ended(attempt, self._met(attempt, measures), measures.tpot_s)
        if attempt.instance is None:
            return
        measures = Measures.of(attempt)
        if self.feedback is not None:
            model = attempt.request.model or self.fleet.default_model
            self.feedback.ended(EndedAttempt.of(attempt, measures, model, self._met(attempt, measures), now))
        self.scheduler.observe(
            Finished(
                request_id=attempt.request.request_id,
                attempt=attempt.attempt,
                instance_id=attempt.instance.spec.instance_id,
                status=measures.status,
                input_tokens=attempt.request.input_tokens,
                cached_tokens=attempt.cached_tokens,
                output_tokens=attempt.generated,
                ttft_s=measures.ttft_s,
                tpot_s=measures.tpot_s,
                time_s=now,
            )
        )

    # --- helpers ------------------------------------------------------------------------------
    def _met(self, attempt: Attempt, measures: Measures) -> bool:
        return met_objective(attempt, measures, self.config.slo_classes.get(attempt.request.slo_class))

    def _timeout_at(self, attempt: Attempt) -> float | None:
        return self.clients.give_up_at(attempt, deadline_at(attempt.request))

    def _snapshot(self, now: float) -> ClusterView:
        """Every running instance's heartbeat now (a replica that is off sends none and has no
        row, as in a deployment); an instance of a DC that is down sends none either, so its
        last row stays, with its age."""
        on = self.shaper.replicas.on_rows() if self.shaper.plans else None
        for index in range(len(self.instances)) if on is None else on:
            if index not in self._down:
                self._last_beat[index] = self.instances[index].heartbeat(now)
                self._beat_s[index] = now
        specs = self.shaper.replicas.specs() if self.shaper.plans else self.fleet.instances
        beats, instances, beat_s = self._last_beat, self.instances, self._beat_s
        if on is not None:
            specs, beats, instances = (
                tuple(specs[i] for i in on),
                [beats[i] for i in on],
                [instances[i] for i in on],
            )
            beat_s = beat_s[on]
        return ClusterView(
            version=next(self._versions),
            instance_ids=tuple(s.instance_id for s in specs),
            dc=np.array([s.dc for s in specs]),
            model=np.array([s.model for s in specs]),
            model_version=np.array([s.version for s in specs]),
            profile=np.array([s.profile.name for s in specs]),
            ready=self.shaper.replicas.ready_mask()[on]
            if on is not None
            else np.ones(len(specs), dtype=bool),
            waiting=np.array([r[0] for r in beats], dtype=np.int64),
            running=np.array([r[1] for r in beats], dtype=np.int64),
            tokens_in_flight=np.array([r[2] for r in beats], dtype=np.int64),
            kv_used=np.array([r[3] for r in beats], dtype=np.int64),
            kv_total=np.array([i.kv_blocks_total for i in instances], dtype=np.int64),
            last_heartbeat_s=beat_s.copy(),
            dcs=self._dcs,
            role=np.array([s.role for s in specs]),
            kv_bytes_per_token=np.array([s.profile.kv_bytes_per_token for s in specs], dtype=np.int64),
        )

    def _index_of_row(self, row: int) -> int:
        return self._view_slots[row]

    def _index_of_id(self, instance_id: str) -> int:
        return self._slot_of_id[instance_id]

    def _bind_decode(self, client: Attempt, decided_id: str, now: float) -> str:
        view = request_view(client, self.fleet.default_model)
        return self.scheduler.bind_decode(view, self._view, decided_id, now)

    def _observe(self, event: PrefillDone) -> None:
        self.scheduler.observe(event)

    def _at_transferred(self, time_s: float, payload: tuple[Attempt, int, Instance]) -> None:
        self._push(time_s, _TRANSFERRED, payload)

    def _slots_of(self, view: ClusterView) -> list[int]:
        """Row -> instance index, for a view (its rows are the instances that were on)."""
        return [self._slot_of_id[iid] for iid in view.instance_ids]

    def _push(self, time_s: float, kind: int, payload: object) -> None:
        heapq.heappush(self._heap, (time_s, kind, next(self._seq), payload))


def simulate(
    workload: Workload,
    fleet: FleetSpec,
    policy_name: str,
    config: SimConfig,
    progress: ProgressFn | None = None,
    params: StageParams | None = None,
    feedback: OutcomeSink | None = None,
    planner: Planner | None = None,
) -> RunResult:
    """Run one policy (a fresh scheduler seeded with ``config.seed``, or ``config.deciders`` of
    them) over the workload; ``feedback``: where a closed-loop admission stage's outcomes go
    (default: in memory); ``planner``: who shapes the fleet (default: ``static``)."""
    scheduler = pool_decider_for(policy_name, fleet, config, params)
    return Simulation(workload, fleet, scheduler, config, feedback, planner).run(progress)
