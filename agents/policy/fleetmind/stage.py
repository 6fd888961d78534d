"""FleetMind, the DC-selection stage ``fleetmind``: hard rules first, then total cost.

For request r, with v = the version it must run on (``FleetRules.version_for``):

1. **Rules (fail closed).** A = { d : rules allow r in d (``rules.py``) }. If no d in A has an
   instance of (model, v) deployed: reject (``not_permitted`` when the rules removed every DC
   that has it, else ``no_version``). Never another model or version.
2. **Serving.** S = { d ∈ A : d reachable, d has a ready instance of (model, v) with a heartbeat younger than
   ``stale_after_s`` = 2 heartbeat intervals, and d's health lets r in (``health.py``: down DCs
   take nothing, recovering ones a growing share) }. S empty: hold (``no_capacity``).
3. **Home.** h = the DC the tenant's reservation is booked in, else r's ``home_dc``. A request of
   a *session* (its prompt continues a prompt placed before, ``sessions.py``) stays in that
   session's DC while it is in S: its cache is there. A tenant without ``cross_region``, or a
   request whose home is the only DC in S, goes home.
4. **Cost** of d ∈ S, in seconds: cost(d) = rtt(d) + input_tokens·bytes_per_token / bandwidth
   + TTFT predicted by the instance router for its best instance in d (TokenPilot's calibrated
   predictor: queue wait, compute and the prefix cached there), or, for a router without a
   predictor, (tokens in flight per ready instance + input) / ``prefill_tokens_per_s``.
5. **Divert only when it pays.** Divert targets D = {d ∈ S, d ≠ h : load_others(d) < load_limit}
   (load_others: tokens in flight over the capacity not booked by other tenants' reservations).
   Choose h unless min_{d∈D} cost(d) < cost(h) - ``divert_margin_s``; if h ∉ S, the cheapest of S.
6. **Decode pressure.** TTFT is not the whole objective: a DC whose decode batches have grown
   streams every token slowly. tpot(d) is the mean TPOT of the attempts that finished in d (an
   exponentially weighted mean over completions, weight ``tpot_weight``: what a proxying router
   measures). When tpot(h) > ``tpot_guard`` x the request class's TPOT objective, h is *hot*:
   the request goes to the cheapest d ∈ D that is not hot, if cost(d) is within the class's TTFT
   objective (new work stops piling onto slow decode batches; running work is never moved).

Notices (``notices.py``) for DC state changes, reservation moves and replica advice are drained
by the driver through ``drain_notices``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from agents.policy.common.slo import DEFAULT_SLO_CLASSES, SloClass
from agents.policy.fleetmind.advice import PlacementAdvisor
from agents.policy.fleetmind.capacity import STALE_AFTER_HEARTBEATS, DcCapacity, aggregate, next_expiry
from agents.policy.fleetmind.health import DcHealth
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.fleetmind.reservations import ReservationBook
from agents.policy.fleetmind.rules import FleetRules, parse_rules
from agents.policy.fleetmind.sessions import SessionMap
from agents.policy.types import (
    ClusterView,
    DcChoice,
    DcView,
    Finished,
    Observation,
    RequestView,
    RowPredictor,
)


class FleetMind:
    name = "fleetmind"
    wants_kv_events = False

    def __init__(
        self,
        seed: int = 0,
        rules: FleetRules | Mapping[str, Any] | None = None,
        heartbeat_s: float = 0.25,
        divert_margin_s: float = 0.2,
        load_limit: float = 0.9,
        recovery_s: float = 10.0,
        bytes_per_token: float = 4.0,
        bandwidth_bytes_per_s: float = 1.25e8,
        prefill_tokens_per_s: float = 8000.0,
        session_ttl_s: float = 600.0,
        tpot_guard: float = 0.5,
        tpot_weight: float = 0.05,
        slo_classes: Mapping[str, SloClass] | None = None,
    ) -> None:
        """``rules``: a ``FleetRules`` or its YAML mapping (``parse_rules``); none = every DC
        allowed to every tenant, no pinned version. Times in seconds."""
        del seed  # deterministic
        self.rules = rules if isinstance(rules, FleetRules) else parse_rules(rules or {})
        self.stale_after_s = STALE_AFTER_HEARTBEATS * heartbeat_s
        self.divert_margin_s = divert_margin_s
        self.load_limit = load_limit
        self.transfer_s_per_token = bytes_per_token / bandwidth_bytes_per_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.tpot_guard, self.tpot_weight = tpot_guard, tpot_weight
        self.slo_classes = dict(slo_classes or DEFAULT_SLO_CLASSES)
        self._tpot: dict[str, float] = {}  # DC -> weighted mean TPOT of its completions (s)
        self._dc_of: dict[str, str] = {}  # instance id -> DC, from the latest snapshot
        self._ids: tuple[str, ...] = ()
        self.health = DcHealth(recovery_s)
        self.reservations = ReservationBook(self.rules.reservations)
        self.sessions = SessionMap(session_ttl_s)
        self._dcs = DcView()
        self._reserved_version: dict[str, str] = {}
        self._asked: dict[tuple[str, str], None] = {}  # (model, version) requests named, in order
        self._advisor = PlacementAdvisor(self.rules, lambda dc: self._dcs.rtt(dc))
        self._router: RowPredictor | None = None
        self._notices: list[FleetNotice] = []
        self._capacity_key: tuple[int, str, str] | None = None
        self._capacity: dict[str, DcCapacity] = {}
        self._capacity_until = 0.0

    def bind_router(self, router: object) -> None:
        """Use the instance router's per-row TTFT predictions where it has them."""
        self._router = router if isinstance(router, RowPredictor) else None

    def refresh(self, view: ClusterView, now_s: float) -> None:
        """Re-aggregate every (model, version) asked for so far: DC health, reservations and
        advice move with time even when no request comes (the worker's timer)."""
        for model, version in list(self._asked):
            self._capacities(view, model, version, now_s)

    def drain_notices(self) -> list[FleetNotice]:
        notices, self._notices = self._notices, []
        return notices

    def observe(self, event: Observation) -> None:
        """Completions feed each DC's observed TPOT (step 6)."""
        if isinstance(event, Finished) and event.status == "ok" and event.tpot_s is not None:
            dc = self._dc_of.get(event.instance_id)
            if dc is not None:
                old = self._tpot.get(dc)
                w = self.tpot_weight
                self._tpot[dc] = event.tpot_s if old is None else (1 - w) * old + w * event.tpot_s

    # --- the decision -------------------------------------------------------------------------

    def select(self, request: RequestView, view: ClusterView, now_s: float) -> DcChoice:
        version = self.rules.version_for(request)
        capacities = self._capacities(view, request.model, version, now_s)
        permitted = [d for d in capacities if self.rules.allows(request, d)]
        if not permitted:
            return self._reject(request, version, capacities, len(view))
        allowed = [d for d in permitted if view.dcs.is_reachable(d)]
        serving = [
            d
            for d in allowed
            if capacities[d].ready
            and self.health.lets_in(d, request.model, version, request.request_id, now_s)
        ]
        if not serving:
            return DcChoice(
                "", np.zeros(len(view), dtype=bool),
                f"no_capacity: no ready instance of {_named(request.model, version)} in "
                f"{', '.join(sorted(permitted))} (allowed for tenant {request.tenant})",
            )  # fmt: skip
        chosen, reason = self._choose(request, view, version, capacities, serving, now_s)
        self.sessions.placed(request, chosen, now_s)
        return DcChoice(chosen, capacities[chosen].rows, reason)

    def _choose(
        self,
        request: RequestView,
        view: ClusterView,
        version: str,
        caps: dict[str, DcCapacity],
        serving: list[str],
        now_s: float,
    ) -> tuple[str, str]:
        session_dc = self.sessions.dc_of(request, now_s)
        if session_dc in serving:
            return session_dc, "session stays where its cache is"
        home = self.reservations.home_of(request.tenant) or request.home_dc
        if home in serving and (len(serving) == 1 or not self.rules.may_divert(request)):
            return home, "home data centre"
        costs = self._costs(request, view, caps, serving, now_s)
        if home not in serving:
            best = min(serving, key=lambda d: (costs[d], d))
            return best, f"fallback: home {home or '-'} cannot serve; cost {costs[best]:.3f} s"
        targets = [
            d for d in serving if d != home and self._load_for_others(request, caps[d]) < self.load_limit
        ]
        if not targets:
            return home, "home data centre (other DCs at their load limit)"
        best = min(targets, key=lambda d: (costs[d], d))
        if costs[best] < costs[home] - self.divert_margin_s:
            return best, f"diverted from {home}: cost {costs[best]:.3f} s vs {costs[home]:.3f} s"
        return self._away_from_slow_decode(request, home, targets, costs) or (
            home,
            f"home data centre (cost {costs[home]:.3f} s)",
        )

    def _away_from_slow_decode(
        self, request: RequestView, home: str, targets: list[str], costs: dict[str, float]
    ) -> tuple[str, str] | None:
        """Step 6: the cheapest target that is not hot, when home is hot and the target is within
        the class's TTFT objective; None otherwise."""
        slo = self.slo_classes.get(request.slo_class)
        if slo is None or slo.tpot_s is None:
            return None
        limit = self.tpot_guard * slo.tpot_s
        if self._tpot.get(home, 0.0) <= limit:
            return None
        cool = [d for d in targets if self._tpot.get(d, 0.0) <= limit]
        if not cool:
            return None
        best = min(cool, key=lambda d: (costs[d], d))
        if slo.ttft_s is not None and costs[best] > slo.ttft_s:
            return None
        return best, f"diverted from {home}: its decode TPOT {self._tpot[home]:.3f} s > {limit:.3f} s"

    def _costs(
        self,
        request: RequestView,
        view: ClusterView,
        caps: dict[str, DcCapacity],
        serving: list[str],
        now_s: float,
    ) -> dict[str, float]:
        """cost(d) of the module docstring, for every d in ``serving``."""
        transfer = request.input_tokens * self.transfer_s_per_token
        predicted = None if self._router is None else self._router.predict_rows(request, view, now_s).ttft_s
        costs = {}
        for dc in serving:
            cap = caps[dc]
            if predicted is not None:
                ttft = float(predicted[cap.rows].min())
            else:
                ttft = (cap.tokens_in_flight / cap.ready + request.input_tokens) / self.prefill_tokens_per_s
            costs[dc] = view.dcs.rtt(dc) + transfer + ttft
        return costs

    def _load_for_others(self, request: RequestView, cap: DcCapacity) -> float:
        """Load of ``cap``'s DC over the capacity not booked by another tenant."""
        booked = self.reservations.booked_in(cap.dc, request.model)  # never the tenant's own: that is home
        free = cap.token_capacity * max(cap.ready - booked, 0) / cap.ready
        return cap.tokens_in_flight / free if free > 0 else float("inf")

    def _reject(self, request: RequestView, version: str, caps: dict[str, DcCapacity], rows: int) -> DcChoice:
        named = _named(request.model, version)
        if caps:
            reason = (
                f"not_permitted: tenant {request.tenant}'s rules (and the request's allowed regions) "
                f"allow none of the DCs serving {named}: {', '.join(sorted(caps))}"
            )
        else:
            reason = f"no_version: {named} is deployed in no data centre"
        return DcChoice("", np.zeros(rows, dtype=bool), reason, reject=True)

    # --- per-snapshot state -------------------------------------------------------------------

    def _capacities(self, view: ClusterView, model: str, version: str, now_s: float) -> dict[str, DcCapacity]:
        """``aggregate`` once per (snapshot, model, version), again when an instance goes stale;
        each new aggregate updates DC health, reservations and replica advice."""
        self._asked[(model, version)] = None
        key = (view.version, model, version)
        if key == self._capacity_key and now_s < self._capacity_until:
            return self._capacity
        caps = aggregate(view, model, version, now_s, self.stale_after_s)
        serving = np.zeros(len(view), dtype=bool)
        for cap in caps.values():
            serving |= cap.rows
        self._capacity_key, self._capacity = key, caps
        self._capacity_until = next_expiry(view, serving, self.stale_after_s)
        self._dcs = view.dcs
        if view.instance_ids is not self._ids:
            self._ids, self._dc_of = (
                view.instance_ids,
                dict(zip(view.instance_ids, view.dc.tolist(), strict=True)),
            )
        self._notices += self.health.update(model, version, caps, now_s)
        # A reservation is of one version: the pinned one, else the first one asked for.
        if version == self._reserved_version.setdefault(model, self.rules.versions.get(model) or version):
            self._notices += self.reservations.rebook(model, version, caps, now_s)
        self._notices += self._advisor.sample(model, version, caps, now_s)
        return caps


def _named(model: str, version: str) -> str:
    return f"{model} version {version}" if version else model
