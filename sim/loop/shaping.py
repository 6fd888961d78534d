"""Who shapes the fleet in a simulated run: the planner, every row's state (``Replicas``) and
what the planner learns of the demand (``DemandLedger``), behind one object the runner calls.

The runner (``sim/loop/runner.py``) owns the clock: it asks ``plan`` every ``interval_s``,
turns what ``Replicas.converge`` returns into engines that start and drain, and tells the
shaper what happened to each request (``arrived``, ``held``, ``rejected``, ``ended``). A run
with the ``static`` planner has no slots and never plans: the fleet is the file's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agents.policy.planners import Planner, StaticPlanner
from agents.policy.planners.contract import planned_objective
from agents.policy.types import ClusterView
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.loop.config import SimConfig
from sim.loop.demand import DemandLedger
from sim.loop.replicas import Replicas, slot_fleet
from sim.workloads.trace import TraceRequest


class FleetShaper:
    def __init__(
        self, planner: Planner | None, fleet: FleetSpec, window: tuple[float, float], config: SimConfig
    ) -> None:
        """``fleet`` as listed; ``self.fleet`` is its rows (with a planner that plans: the
        slots too, ``slot_fleet``). The drain grace outlasts any decision taken on a heartbeat
        that still showed the replica ready: two heartbeats, the signal's delay and the longest
        one-way trip from the ingress."""
        self.planner = planner or StaticPlanner()
        self.plans = math.isfinite(self.planner.interval_s)
        listed = len(fleet.instances)
        self.fleet = slot_fleet(fleet) if self.plans else fleet
        longest_trip = max(fleet.rtt(fleet.ingress_dc, dc) for dc in fleet.dc_names) / 2
        grace = 2 * config.heartbeat_s + config.signal_delay_s + longest_trip
        self.replicas = Replicas(self.fleet, listed, window, grace)
        self.demand = DemandLedger(window[0], self.replicas.timeline_step_s)
        self.window = window
        self._objective = planned_objective(config.slo_classes)
        self._versions_of = {spec.model: spec.version for spec in reversed(self.fleet.instances)}
        self._held_once: set[str] = set()

    def key(self, request: TraceRequest) -> tuple[str, str, str]:
        """``(model, version, home DC)`` of a request as the planner counts it."""
        model = request.model or self.fleet.default_model
        version = request.model_version or self._versions_of.get(model, "")
        return model, version, request.home_dc or self.fleet.ingress_dc

    def arrived(self, attempt: Attempt, now: float) -> None:
        """A first attempt arrived: new demand."""
        request = attempt.request
        self.demand.arrived(*self.key(request), request.input_tokens, attempt.output_budget, now)

    def held(self, request: TraceRequest) -> None:
        """Admission held the request (counted once per request)."""
        if request.request_id not in self._held_once:
            self._held_once.add(request.request_id)
            self.demand.held(*self.key(request))

    def rejected(self, request: TraceRequest) -> None:
        self.demand.rejected(*self.key(request))

    def ended(self, attempt: Attempt, met: bool, tpot_s: float | None) -> None:
        """An attempt ended (ok, timed out or failed; ``met``: within its objective); an ok
        one on an instance also tells its pool its TPOT."""
        request = attempt.request
        key = self.key(request)
        self.demand.completed(*key, request.input_tokens, attempt.cached_tokens, attempt.generated, met)
        if attempt.status == "ok" and attempt.instance is not None:
            self.replicas.ended_ok(attempt.instance.spec.instance_id, tpot_s)

    def plan(self, now: float, view: ClusterView, view_slots: Sequence[int]) -> None:
        """Ask the planner for the fleet's shape on the newest view and adopt it."""
        state = self.replicas.fleet_state(now, view, view_slots, self.demand.take(now), self._objective)
        self.replicas.apply(self.planner.plan(state), now)

    def held_s(self) -> list[float]:
        """Seconds each row held its GPUs inside the window."""
        return self.replicas.held_s(self.window[1])

    def figures(self) -> dict[str, object]:
        """The shape's figures (``Replicas.figures``), with the demand per model beside them."""
        steps = len(self.replicas.timeline)
        return self.replicas.figures(self.window[1], self.demand.per_step(steps))
