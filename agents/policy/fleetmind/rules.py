"""FleetMind's configuration: where each DC is, what each tenant may use, which version is current.

The hard rules are evaluated before any cost, and they fail closed:

    allowed(request) = { d : permitted(tenant, d) ∧ resident(tenant, d) ∧ narrowed(request, d)
                              ∧ (tenant.cross_region or region(d) = region(home)) }

- ``permitted``: the tenant's ``dcs`` list (empty = every DC);
- ``resident``: the region of ``d`` is in the tenant's ``regions`` (empty = every region). A DC the
  rules do not describe has no known region, so it is resident for no tenant that has regions;
- ``narrowed``: the request's own ``allowed_regions`` (region or DC names; empty = no narrowing)
  can only remove DCs, never add one;
- a tenant without ``cross_region`` stays in its home DC's region (a request without a home DC
  then has no region to stay in, and no DC is allowed).

A tenant the rules do not list gets ``default_tenant``. ``versions`` pins, per model, the version
a request that names none must run on; a request never runs on another version (a model with no
pin accepts any version only when the request names none).

``reservations``: tenants that own capacity: ``instances`` instances of ``model`` booked in one DC
at a time, the first of ``dcs`` (priority order) that can hold them (``reservations.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.policy.types import RequestView


@dataclass(frozen=True, slots=True)
class DcInfo:
    """One data centre: its ``region`` (residency), ``failure_domain`` (placement spreads across
    them) and ``gpu_slots`` (instances it could host; 0 = unknown, no replica is added there)."""

    name: str
    region: str
    failure_domain: str
    gpu_slots: int = 0


@dataclass(frozen=True, slots=True)
class TenantRule:
    """What one tenant may use; see the module docstring for how the fields combine."""

    regions: tuple[str, ...] = ()
    dcs: tuple[str, ...] = ()
    cross_region: bool = True


@dataclass(frozen=True, slots=True)
class Reservation:
    """``tenant`` owns ``instances`` instances of ``model``, booked in the first DC of ``dcs``
    that can hold them."""

    tenant: str
    model: str
    instances: int
    dcs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FleetRules:
    dcs: Mapping[str, DcInfo] = field(default_factory=dict)
    tenants: Mapping[str, TenantRule] = field(default_factory=dict)
    default_tenant: TenantRule = TenantRule()
    versions: Mapping[str, str] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    gpu_budget: int = 0  # instances the whole fleet may grow to (0 = no replica recommendations)

    def rule_for(self, tenant: str) -> TenantRule:
        return self.tenants.get(tenant, self.default_tenant)

    def region_of(self, dc: str) -> str | None:
        info = self.dcs.get(dc)
        return None if info is None else info.region

    def version_for(self, request: RequestView) -> str:
        """The version the request must run on ("" = any: no version named and none pinned)."""
        return request.model_version or self.versions.get(request.model, "")

    def allows(self, request: RequestView, dc: str) -> bool:
        """Whether the hard rules let ``request`` run in ``dc`` (the module docstring's formula)."""
        rule = self.rule_for(request.tenant)
        region = self.region_of(dc)
        if rule.dcs and dc not in rule.dcs:
            return False
        if rule.regions and region not in rule.regions:
            return False
        if (
            request.allowed_regions
            and dc not in request.allowed_regions
            and region not in request.allowed_regions
        ):
            return False
        if not rule.cross_region:
            home_region = self.region_of(request.home_dc) if request.home_dc else None
            if home_region is None or region != home_region:
                return dc == request.home_dc and bool(dc)
        return True

    def may_divert(self, request: RequestView) -> bool:
        """Whether the tenant allows execution outside the home DC at all."""
        return self.rule_for(request.tenant).cross_region


def parse_rules(doc: Mapping[str, Any]) -> FleetRules:
    """Rules from a fleet YAML document (``sim/engine/fleet.py`` documents the whole format):
    ``data_centres[].{name, region, failure_domain, gpu_slots}``, ``tenants: {NAME: {regions,
    dcs, cross_region}}`` (``default`` for any other tenant), ``models: {NAME: {version}}``,
    ``reservations: [{tenant, model, instances, dcs}]``, ``gpu_budget``. ``ValueError`` naming
    the field when one is malformed."""
    try:
        dcs = {}
        for entry in doc.get("data_centres") or []:
            name = str(entry["name"])
            region = str(entry.get("region", name))
            dcs[name] = DcInfo(
                name,
                region,
                str(entry.get("failure_domain", region)),
                _count(entry.get("gpu_slots", 0), "gpu_slots"),
            )
        tenants = {str(name): _tenant(name, rule or {}) for name, rule in (doc.get("tenants") or {}).items()}
        default = tenants.pop("default", TenantRule())
        models = doc.get("models") or {}
        for model, spec in models.items():
            if spec is not None and not isinstance(spec, dict):
                raise ValueError(f"model {model!r} must be a mapping (version, load_s, ...), got {spec!r}")
        versions = {
            str(model): str(spec["version"]) for model, spec in models.items() if "version" in (spec or {})
        }
        reservations = tuple(
            Reservation(
                str(r["tenant"]),
                str(r["model"]),
                _count(r["instances"], "instances"),
                _names(r["dcs"], "dcs"),
            )
            for r in doc.get("reservations") or []
        )
        gpu_budget = _count(doc.get("gpu_budget", 0), "gpu_budget")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"fleet rules: {type(exc).__name__}: {exc}") from None
    tenants_of = [r.tenant for r in reservations]
    if len(set(tenants_of)) != len(tenants_of):
        raise ValueError(
            "fleet rules: a tenant has two reservations (a reservation is booked in one DC at a time)"
        )
    return FleetRules(dcs, tenants, default, versions, reservations, gpu_budget)


def _tenant(name: object, rule: Mapping[str, Any]) -> TenantRule:
    if not isinstance(rule, Mapping):
        raise ValueError(f"fleet rules: tenant {name!r} must be a mapping")
    cross = rule.get("cross_region", True)
    if not isinstance(cross, bool):
        raise ValueError(f"fleet rules: tenant {name!r}: cross_region must be true or false")
    return TenantRule(_names(rule.get("regions", ()), "regions"), _names(rule.get("dcs", ()), "dcs"), cross)


def _names(value: object, what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"fleet rules: {what} must be a list of names, got {value!r}")
    return tuple(str(v) for v in value)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fleet rules: {what} must be an integer >= 0, got {value!r}")
    return value
