"""Violations of the fleet file's rules, judged from what happened, by code of its own.

The judge reads two things: the fleet file (the parsed YAML document, ``FleetSpec.document``, in
the format ``sim/engine/fleet.py`` documents) and the run's sends (``sim.loop.runner.Send``:
every admit, the instance and DC it went to, when, and the scheduler's newest row of that
instance then). It shares no code with the policy it judges: nothing here is imported from
``agents.policy.fleetmind`` (``tests/unit/test_layers.py`` checks it), so a clause broken in
FleetMind's rules is still enforced here.

Definitions. A send of request r (tenant t, home DC h, allowed regions A, model m, version v)
to instance i (in DC d, serving model m_i at version v_i), at time τ:

- region(x) = the ``region`` of data centre x in ``data_centres`` (its name when it gives none),
  unknown for a DC the file does not list; rule(t) = ``tenants[t]``, else ``tenants.default``,
  else no restriction. An empty or absent list restricts nothing; ``cross_region`` defaults
  to true.
- **permission**: rule(t) lists ``dcs`` and d is not among them.
- **residency**: rule(t) lists ``regions`` and region(d) is not among them (an unknown region
  is in no list); or r names ``allowed_regions`` and neither d nor region(d) is in them; or
  rule(t) says ``cross_region: false`` and r left home, where r stays home ⟺ (h ≠ "" ∧ d = h) or
  (region(h) known ∧ region(d) = region(h)).
- **model**: m_i ≠ m*, where m* = m, or the fleet's default model (its first instance's) when
  r names none.
- **version**: V = v if r names one, else ``models[m*].version`` if the file pins one, else
  none; a violation when V is set and v_i ≠ V.
- **cut off**: d was cut off at τ by an ``outages`` entry ``{dc: d, down_s, up_s}`` (seconds
  from the run's first arrival t0), and had been for longer than the staleness window W:
  t0 + down_s + W < τ < t0 + up_s. W = ``STALE_AFTER_HEARTBEATS`` heartbeat intervals; before
  t0 + down_s + W the DC's last heartbeats were still fresh and no router could have known.
- **not ready**: the scheduler's newest row of i said not ready, or was stale when sent
  (τ - taken > W), and the send is not cut off (a send into a cut-off DC counts once).

Each kind counts sends (an attempt retried is judged again); a send that breaks several rules
counts once in each, and ``total`` is the sum of the kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: at run time this module imports nothing of the project
    from sim.engine.fleet import FleetSpec
    from sim.loop.results import RunResult, Send

KINDS = ("permission", "residency", "version", "model", "not_ready", "cut_off")
PLACEMENT_KINDS = ("permission", "residency", "version", "model")
"""The kinds decided by where a request went alone (the others also need when)."""

STALE_AFTER_HEARTBEATS = 2
"""The staleness window, in heartbeat intervals: a row older than this is no evidence that its
instance is up (one heartbeat may come late; two missed in a row mean it is not reporting). A
property of the heartbeat protocol, stated here on its own; FleetMind's figure must agree
(``tests/unit/sim/test_violations.py`` checks it)."""


class Requested(Protocol):
    """What the judge reads of a request (``TraceRequest`` and ``RequestView`` both have it)."""

    @property
    def tenant(self) -> str: ...
    @property
    def home_dc(self) -> str: ...
    @property
    def allowed_regions(self) -> tuple[str, ...]: ...
    @property
    def model(self) -> str | None: ...
    @property
    def model_version(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Tenant:
    """What a tenant may use, as the fleet file says (empty: no restriction)."""

    regions: frozenset[str] = frozenset()
    dcs: frozenset[str] = frozenset()
    cross_region: bool = True


@dataclass(frozen=True, slots=True)
class Outage:
    dc: str
    down_s: float
    up_s: float


@dataclass(frozen=True, slots=True)
class FleetFile:
    """The judge's own reading of a fleet file: only what the rules need."""

    regions: Mapping[str, str] = field(default_factory=dict)  # DC -> region
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    default_tenant: Tenant = Tenant()
    pinned_versions: Mapping[str, str] = field(default_factory=dict)  # model -> version
    outages: tuple[Outage, ...] = ()

    @classmethod
    def read(cls, document: Mapping[str, Any] | None) -> FleetFile:
        """From a parsed fleet file (None, a ``COUNTxPROFILE`` fleet: one DC and no rules).
        The loader has already refused a malformed file, so only absent keys need defaults."""
        if document is None:
            return cls()
        regions = {
            str(dc["name"]): str(dc.get("region", dc["name"])) for dc in document.get("data_centres") or []
        }
        tenants = {str(name): _tenant(terms or {}) for name, terms in (document.get("tenants") or {}).items()}
        default = tenants.pop("default", Tenant())
        models = (document.get("models") or {}).items()
        pinned = {str(model): str(spec["version"]) for model, spec in models if "version" in (spec or {})}
        outages = tuple(
            Outage(str(o["dc"]), float(o["down_s"]), float(o["up_s"])) for o in document.get("outages") or []
        )
        return cls(regions, tenants, default, pinned, outages)

    def tenant(self, name: str) -> Tenant:
        return self.tenants.get(name, self.default_tenant)

    def required_version(self, request: Requested, default_model: str) -> str:
        """V of the module docstring ("" = any)."""
        return request.model_version or self.pinned_versions.get(request.model or default_model, "")

    def cut_off(self, dc: str, time_s: float, start_s: float, stale_after_s: float) -> bool:
        """Whether ``dc`` had been cut off for longer than the staleness window at ``time_s``."""
        return any(
            o.dc == dc and start_s + o.down_s + stale_after_s < time_s < start_s + o.up_s
            for o in self.outages
        )


def _tenant(terms: Mapping[str, Any]) -> Tenant:
    return Tenant(
        frozenset(str(r) for r in terms.get("regions") or ()),
        frozenset(str(d) for d in terms.get("dcs") or ()),
        terms.get("cross_region", True) is not False,
    )


def placement_breaches(
    fleet: FleetFile, request: Requested, dc: str, model: str, version: str, default_model: str
) -> tuple[str, ...]:
    """The ``PLACEMENT_KINDS`` that running ``request`` in ``dc`` on an instance of ``model`` at
    ``version`` breaks (module docstring), in ``KINDS`` order; () when it breaks none."""
    tenant = fleet.tenant(request.tenant)
    region = fleet.regions.get(dc)
    broken = []
    if tenant.dcs and dc not in tenant.dcs:
        broken.append("permission")
    outside_regions = bool(tenant.regions) and region not in tenant.regions
    narrowed_out = bool(request.allowed_regions) and not (
        dc in request.allowed_regions or region in request.allowed_regions
    )
    home_region = fleet.regions.get(request.home_dc)
    stays_home = (bool(request.home_dc) and dc == request.home_dc) or (
        home_region is not None and region == home_region
    )
    if outside_regions or narrowed_out or (not tenant.cross_region and not stays_home):
        broken.append("residency")
    required = fleet.required_version(request, default_model)
    if required and version != required:
        broken.append("version")
    if model != (request.model or default_model):
        broken.append("model")
    return tuple(broken)


def count_violations(
    fleet: FleetFile, sends: Iterable[Send], default_model: str, heartbeat_s: float, start_s: float
) -> dict[str, int]:
    """``{kind: sends that break it, ..., "total": their sum}`` over ``sends`` (module docstring);
    ``start_s``: the run's first arrival (outages are timed from it)."""
    stale_after_s = STALE_AFTER_HEARTBEATS * heartbeat_s
    counts = dict.fromkeys(KINDS, 0)
    for send in sends:
        for kind in placement_breaches(fleet, send.request, send.dc, send.model, send.version, default_model):
            counts[kind] += 1
        if fleet.cut_off(send.dc, send.sent_s, start_s, stale_after_s):
            counts["cut_off"] += 1
        elif not send.row_ready or send.sent_s - send.row_taken_s > stale_after_s:
            counts["not_ready"] += 1
    return {**counts, "total": sum(counts.values())}


def judge_run(run: RunResult, fleet: FleetSpec, heartbeat_s: float) -> dict[str, int] | None:
    """The violations of ``run`` on ``fleet`` (``count_violations``), or None when the fleet
    was not given as a file (a ``COUNTxPROFILE`` spec has no rules to break). Reads the fleet's
    ``document``, its default model and nothing else of it: never ``fleet.rules``, the policy's
    own reading."""
    if fleet.document is None:
        return None
    return count_violations(
        FleetFile.read(fleet.document), run.sends, fleet.default_model, heartbeat_s, run.window[0]
    )
