"""The planner's view of the fleet: the topics folded into the planners' ``FleetState``
(``agents/policy/planners/contract.py``).

What each input contributes:

- the fleet file (``FleetFacts``, from ``fleet_facts``): each DC's region and failure domain
  (``parse_rules``), its GPU budget, warm capacity and staged models, each model's load times
  and floor (``parse_shape``), the version pinned for a model, and the GPUs of the instances
  and model profiles it lists;
- ``tf.heartbeats``: the newest beat of each instance. An instance whose newest beat is older
  than ``stale_s`` has stopped and counts nowhere. Per pool ``(model, model_version, dc)``:
  ``ready`` = beats with ``endpoint_ready`` and not ``draining``, ``loading`` = not
  ``endpoint_ready`` and not ``draining``, ``draining`` = ``draining``; over the ready ones
  ``waiting``, ``running``, ``tokens_in_flight`` summed and ``kv_usage`` = mean of
  ``kv_blocks_used / kv_blocks_total``. Per DC ``gpus_used`` = the GPUs of its live instances
  (loading, ready and draining). Per model version its GPUs, KV tokens and KV bytes per token
  (below);
- the settings (``Settings.kv_link_gbps``, given to the fold as ``kv_link_gbps``): each DC's
  link for moving KV caches, 0 where they name none (no replica there may run prefill only);
- ``tf.requests``: first attempts (``attempt == 1``, each request id once) are the demand:
  ``arrivals``, ``input_tokens``, ``output_budget`` per ``(model, version, home_dc)``, with
  version = the request's ``model_version``, else the fleet file's pin, else the one version
  the heartbeats show for the model, else "";
- ``tf.admission``: each request id counts once as ``held`` (its first ``queue``) and once as
  ``rejected``, in its request's demand key;
- ``tf.completions``: each (request id, attempt) once: ``completed``, ``met_slo`` (the store's
  definition, ``met_slo`` given), ``output_tokens``, ``completed_input_tokens``;
- ``tf.plans``: the warm set the newest plan named for each DC (else the fleet file's
  ``warm_models``).

A DC's GPU budget is its ``gpus`` in the fleet file, else the GPUs of the instances the file
lists there, else the most GPUs its live instances held at one snapshot. A model's GPUs per
replica: the most its instances' heartbeats said, else its profile in the fleet file, else 1;
its KV tokens: the largest ``kv_blocks_total * KV_BLOCK_TOKENS`` seen; its KV bytes per token:
the largest ``kv_bytes_per_token`` seen.

Demand is counted per window: ``snapshot(now_s)`` is the fleet at ``now_s`` with the demand
since the previous snapshot, and opens the next window. Everything is a function of the events'
own timestamps and the ``now_s`` given (no clock is read), so replaying the topics in timestamp
order with snapshots at the same instants gives the same states again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.policy.fleetmind.rules import FleetRules, parse_rules
from agents.policy.planners.contract import DcState, DemandSample, FleetState, ModelSpec, PoolKey, PoolState
from agents.policy.planners.shape import FleetShape, parse_shape
from schemas.events import AdmissionDecision, Completion, Heartbeat, InferenceRequest, ReplicaPlan

KV_BLOCK_TOKENS = 512
"""Tokens per KV block in a heartbeat (``schemas/events.py``: ``Heartbeat``)."""

DemandKey = tuple[str, str, str]
"""``(model, version, home_dc)``: where a demand sample is counted."""


@dataclass(frozen=True, slots=True)
class FleetFacts:
    """What the fleet file says (module docstring): ``listed_gpus[dc]`` the GPUs of the instances
    it lists in ``dc``, ``model_gpus[model]`` the GPUs of a replica of ``model`` (its profile),
    ``engines[(model, version)]`` the engine profile a replica of it runs: its instances' (an
    instance group's ``version``, default "1"), and ``models.NAME.profile`` at the model's pinned
    version (else "")."""

    rules: FleetRules = field(default_factory=FleetRules)
    shape: FleetShape = field(default_factory=FleetShape)
    listed_gpus: Mapping[str, int] = field(default_factory=dict)
    model_gpus: Mapping[str, int] = field(default_factory=dict)
    engines: Mapping[tuple[str, str], str] = field(default_factory=dict)


def fleet_facts(doc: Mapping[str, Any], gpus_of_profile: Callable[[str], int]) -> FleetFacts:
    """The facts of a fleet YAML document (``sim/engine/fleet.py``'s format; instances optional):
    ``parse_rules``, ``parse_shape``, and the GPUs of the listed instances and model profiles
    (``gpus_of_profile(name)``, ``ValueError`` for an unknown profile). ``ValueError`` naming
    the key that is wrong."""
    try:
        rules, shape = parse_rules(doc), parse_shape(doc)
        listed: dict[str, int] = {}
        model_gpus: dict[str, int] = {}
        engines: dict[tuple[str, str], str] = {}
        for dc in doc.get("data_centres") or []:
            for group in dc.get("instances") or []:
                profile = str(group["profile"])
                gpus = gpus_of_profile(profile)
                count = group.get("count", 1)
                if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                    raise ValueError(f"data centre {dc['name']!r}: count must be an integer >= 1")
                listed[str(dc["name"])] = listed.get(str(dc["name"]), 0) + count * gpus
                if "model" in group:
                    model_gpus.setdefault(str(group["model"]), gpus)
                    engines.setdefault((str(group["model"]), str(group.get("version", "1"))), profile)
        for name, entry in (doc.get("models") or {}).items():
            if isinstance(entry, Mapping) and "profile" in entry:
                model_gpus[str(name)] = gpus_of_profile(str(entry["profile"]))
                engines[(str(name), rules.versions.get(str(name), ""))] = str(entry["profile"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a fleet file ({type(exc).__name__}: {exc})") from None
    return FleetFacts(rules, shape, listed, model_gpus, engines)


@dataclass(slots=True)
class _Request:
    """What is remembered of a request id: its demand key, when it was first seen, whether it
    was counted held and rejected, and the attempts whose completion was counted."""

    key: DemandKey
    ts: float
    held: bool = False
    rejected: bool = False
    completed: set[int] = field(default_factory=set)


class FleetFold:
    """The topics folded into a ``FleetState`` (module docstring).

    ``stale_s``: an instance whose newest heartbeat is older has stopped. ``memory_s``: how long
    a request id is remembered (to join its admissions and completions, and to count it once);
    at most ``max_requests`` are (the oldest are forgotten first). ``met_slo(completion)``: did
    it meet its objective. ``slo_ttft_s`` / ``slo_tpot_s``: the objective the fleet is planned
    for (``FleetState``). ``kv_link_gbps``: DC -> its KV link in Gb/s (``DcState.kv_link_gbps``;
    a DC not named has none)."""

    def __init__(
        self,
        facts: FleetFacts,
        met_slo: Callable[[Completion], bool],
        *,
        stale_s: float = 5.0,
        memory_s: float = 3600.0,
        max_requests: int = 500_000,
        slo_ttft_s: float = 2.0,
        slo_tpot_s: float = 0.1,
        kv_link_gbps: Mapping[str, float] | None = None,
    ) -> None:
        self.facts = facts
        self.met_slo = met_slo
        self.stale_s, self.memory_s, self.max_requests = stale_s, memory_s, max_requests
        self.slo_ttft_s, self.slo_tpot_s = slo_ttft_s, slo_tpot_s
        self.kv_link_gbps = dict(kv_link_gbps or {})
        self._beats: dict[str, Heartbeat] = {}
        self._ended: dict[
            str, list[float]
        ] = {}  # per instance: ended ok, Σ TPOT, TPOTs (since the last snapshot)
        # (model, version) -> (gpus, KV tokens, KV bytes per token): the largest seen of each
        self._models: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._dcs_seen: dict[str, None] = {}  # in order of first sight
        self._peak_gpus: dict[str, int] = {}
        self._warm: dict[str, tuple[str, ...]] = {}
        self._requests: dict[str, _Request] = {}  # insertion order = first seen
        self._window: dict[DemandKey, DemandSample] = {}  # the demand since the last snapshot
        self._window_start: float | None = None

    # -- the inputs -----------------------------------------------------------------------------

    def add(self, event: object) -> None:
        """Fold one event of any input topic (other kinds are ignored)."""
        if isinstance(event, Heartbeat):
            self.heartbeat(event)
        elif isinstance(event, InferenceRequest):
            self.request(event)
        elif isinstance(event, AdmissionDecision):
            self.admission(event)
        elif isinstance(event, Completion):
            self.completion(event)
        elif isinstance(event, ReplicaPlan):
            self.plan(event)

    def heartbeat(self, beat: Heartbeat) -> None:
        newest = self._beats.get(beat.instance_id)
        if newest is None or beat.ts >= newest.ts:
            self._beats[beat.instance_id] = beat
        gpus, kv, kv_bytes = self._models.get((beat.model, beat.model_version), (0, 0, 0))
        self._models[(beat.model, beat.model_version)] = (
            max(gpus, beat.gpus),
            max(kv, beat.kv_blocks_total * KV_BLOCK_TOKENS),
            max(kv_bytes, beat.kv_bytes_per_token),
        )
        self._dcs_seen.setdefault(beat.dc, None)

    def request(self, request: InferenceRequest) -> None:
        if request.attempt != 1 or request.request_id in self._requests:
            return  # a retry, or a resend of one already counted: not new demand
        key = (request.model, self._version(request.model, request.model_version), request.home_dc)
        self._remember(request.request_id, key, request.ts)
        window = self._window_of(key, request.ts)
        window.arrivals += 1
        window.input_tokens += request.input_tokens
        window.output_budget += request.output_budget

    def admission(self, decision: AdmissionDecision) -> None:
        if decision.action == "admit":
            return
        known = self._known(decision.request_id, decision.model, decision.ts)
        if decision.action == "queue" and not known.held:
            known.held = True
            self._window_of(known.key, decision.ts).held += 1
        elif decision.action == "reject" and not known.rejected:
            known.rejected = True
            self._window_of(known.key, decision.ts).rejected += 1

    def completion(self, completion: Completion) -> None:
        known = self._known(completion.request_id, completion.model, completion.ts)
        if completion.attempt in known.completed:
            return  # redelivered
        known.completed.add(completion.attempt)
        window = self._window_of(known.key, completion.ts)
        window.completed += 1
        met = self.met_slo(completion)
        window.met_slo += int(met)
        window.met_input_tokens += completion.input_tokens if met else 0
        window.output_tokens += completion.output_tokens
        window.completed_input_tokens += completion.input_tokens
        window.cached_tokens += completion.cached_tokens
        if completion.status == "ok":  # its pool's TPOT, for the planner's latency model
            ended = self._ended.setdefault(completion.instance_id, [0, 0.0, 0])
            ended[0] += 1
            if completion.tpot_s is not None:
                ended[1] += completion.tpot_s
                ended[2] += 1

    def plan(self, plan: ReplicaPlan) -> None:
        if plan.warm is not None:
            self._warm[plan.dc] = tuple(plan.warm)

    # -- the state ------------------------------------------------------------------------------

    def open_window(self, start_s: float) -> None:
        """The current demand window starts at ``start_s`` (before the first snapshot; else the
        first window starts at the first demand folded)."""
        self._window_start = start_s

    def snapshot(self, now_s: float) -> FleetState:
        """The fleet at ``now_s``, with the demand since the previous snapshot (the first one:
        since the first event folded); the next window starts here."""
        live = [b for b in self._beats.values() if now_s - b.ts <= self.stale_s]
        self._beats = {b.instance_id: b for b in live}  # a stopped instance is forgotten
        pools = _pools(live, self._ended)
        self._ended = {}
        used: dict[str, int] = {}
        for beat in live:
            used[beat.dc] = used.get(beat.dc, 0) + beat.gpus
        for dc, gpus in used.items():
            self._peak_gpus[dc] = max(self._peak_gpus.get(dc, 0), gpus)
        start = min(self._window_start, now_s) if self._window_start is not None else now_s
        demand = tuple(
            dataclasses.replace(window, start_s=start, end_s=now_s)
            for _, window in sorted(self._window.items())
        )
        self._window, self._window_start = {}, now_s
        self._forget(now_s)
        return FleetState(
            now_s=now_s,
            models=self._model_specs(),
            dcs=tuple(self._dc_state(name, used.get(name, 0)) for name in self._dc_names()),
            pools=pools,
            demand=demand,
            slo_ttft_s=self.slo_ttft_s,
            slo_tpot_s=self.slo_tpot_s,
        )

    @property
    def requests_remembered(self) -> int:
        return len(self._requests)

    def _model_specs(self) -> tuple[ModelSpec, ...]:
        shape, rules = self.facts.shape, self.facts.rules
        seen = dict(self._models)
        for model in [*shape.models, *rules.versions, *self.facts.model_gpus]:
            versions = [v for (m, v) in seen if m == model]
            if not versions:  # named by the fleet file, no replica seen yet
                seen[(model, self._version(model, ""))] = (0, 0, 0)
        specs = []
        for (model, version), (gpus, kv, kv_bytes) in sorted(seen.items()):
            load = shape.model(model)
            gpus = gpus or self.facts.model_gpus.get(model, 1)
            specs.append(
                ModelSpec(model, version, gpus, load.cold_s, load.warm_s, load.min_replicas, kv, kv_bytes)
            )
        return tuple(specs)

    def _dc_names(self) -> list[str]:
        return list(dict.fromkeys([*self.facts.rules.dcs, *self.facts.shape.dcs, *self._dcs_seen]))

    def _dc_state(self, name: str, used: int) -> DcState:
        info = self.facts.rules.dcs.get(name)
        budget = self.facts.shape.dc(name)
        gpus = budget.gpus
        if gpus is None:
            gpus = self.facts.listed_gpus.get(name) or self._peak_gpus.get(name, 0)
        return DcState(
            name=name,
            region=info.region if info is not None else name,
            failure_domain=info.failure_domain if info is not None else name,
            gpus=gpus,
            gpus_used=used,
            warm_capacity=budget.warm_capacity,
            warm=self._warm.get(name, budget.warm_models),
            kv_link_gbps=self.kv_link_gbps.get(name, 0.0),
        )

    def _version(self, model: str, given: str) -> str:
        if given:
            return given
        pinned = self.facts.rules.versions.get(model, "")
        if pinned:
            return pinned
        versions = {v for (m, v) in self._models if m == model}
        return versions.pop() if len(versions) == 1 else ""

    def _window_of(self, key: DemandKey, ts: float) -> DemandSample:
        if self._window_start is None:
            self._window_start = ts
        window = self._window.get(key)
        if window is None:
            window = self._window[key] = DemandSample(*key, start_s=ts, end_s=ts)
        return window

    def _remember(self, request_id: str, key: DemandKey, ts: float) -> _Request:
        known = self._requests[request_id] = _Request(key, ts)
        while len(self._requests) > self.max_requests:
            del self._requests[next(iter(self._requests))]
        return known

    def _known(self, request_id: str, model: str, ts: float) -> _Request:
        """The request's memory; one made now for a request this fold never saw (its request
        came before the window read back): counted under its model's version and no home DC."""
        known = self._requests.get(request_id)
        if known is None:
            known = self._remember(request_id, (model, self._version(model, ""), ""), ts)
        return known

    def _forget(self, now_s: float) -> None:
        while self._requests:
            oldest = next(iter(self._requests))
            if now_s - self._requests[oldest].ts <= self.memory_s:
                break
            del self._requests[oldest]


def _pools(live: Iterable[Heartbeat], ended: Mapping[str, list[float]]) -> tuple[PoolState, ...]:
    """Per pool its replicas by state and their load; ``ended``: per instance, the requests
    that ended ok there since the last snapshot, the sum of their TPOTs and how many had one."""
    grouped: dict[PoolKey, list[Heartbeat]] = {}
    for beat in live:
        grouped.setdefault((beat.model, beat.model_version, beat.dc), []).append(beat)
    pools = []
    for (model, version, dc), beats in sorted(grouped.items()):
        ok, tpot_sum, tpots = (sum(ended.get(b.instance_id, (0, 0.0, 0))[k] for b in beats) for k in range(3))
        ready = [b for b in beats if b.endpoint_ready and not b.draining]
        kv_usage = sum(b.kv_blocks_used / b.kv_blocks_total for b in ready) / len(ready) if ready else 0.0
        pools.append(
            PoolState(
                model,
                version,
                dc,
                ready=len(ready),
                loading=sum(1 for b in beats if not b.endpoint_ready and not b.draining),
                draining=sum(1 for b in beats if b.draining),
                waiting=sum(b.waiting for b in ready),
                running=sum(b.running for b in ready),
                tokens_in_flight=sum(b.tokens_in_flight for b in ready),
                kv_usage=kv_usage,
                completed=int(ok),
                tpot_s=tpot_sum / tpots if tpots else None,
            )
        )
    return tuple(pools)
