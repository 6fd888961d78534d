"""Fleet specs: which instances exist, where, serving which model at which version.

Two forms:
- a string ``8xllama3-8b-h100`` (count x profile, several joined with ``+``): one data centre
  ``dc-1``, and every instance serves one model pool named after the first group's model, so a
  mixed string spec is a heterogeneous pool of one model;
- a YAML file (every key but ``data_centres`` optional)::

      ingress: A              # where requests enter (default: the first DC); may have no GPUs
      data_centres:
        - name: A
          region: eu-a        # residency region (default: the DC's name)
        - name: B
          region: eu-b
          failure_domain: eu-b-1   # replicas are advised across domains (default: the region)
          gpu_slots: 12            # instances it could host (replica advice; default 0 = none)
          price_per_hour: 2.5      # an instance-hour here (default: the profile's; null: none)
          kv_link_gbps: 400         # link moving KV caches from prefill to decode instances
          instances:
            - {count: 4, profile: llama3-8b-h100, model: llama3-8b, version: "2"}
            - {count: 2, profile: llama3-8b-h100, price_per_hour: 1.2}   # e.g. reserved capacity
            - {count: 2, profile: llama3-8b-h100, role: prefill}   # prefill | decode | both
      rtt_ms:                 # round-trip time between data centres (symmetric)
        A: {B: 4, C: 24}
      models:                 # the version a request that names none must run on
        llama3-8b: {version: "2"}
      tenants:                # permissions and residency (FleetMind's hard rules)
        bank: {regions: [eu-b], cross_region: false}
        default: {cross_region: true}
      reservations:           # capacity owned by a tenant, booked in one DC at a time
        - {tenant: bank, model: llama3-8b, instances: 2, dcs: [B, C]}
      gpu_budget: 40          # instances the fleet may grow to (replica advice)
      # The fleet's shape over time (``agents/policy/planners/shape.py``; read by a planner
      # other than ``static``): per DC ``gpus`` (its GPU budget), ``warm_capacity`` and
      # ``warm_models``; per model ``load_s: {cold, warm}``, ``min_replicas`` and ``profile``
      # (the engine profile its new replicas run; default: that of its first instance listed).
      outages:                # simulated failures (simulator only): DC D is cut off
        - {dc: D, down_s: 120, up_s: 180}

Prefill/decode disaggregation: an instance group's ``role`` (default ``both``: it serves
requests whole) and a DC's ``kv_link_gbps`` (default: no link). A ``prefill`` group needs its
DC's link; the KV cache a transfer moves is the profile's ``kv_bytes_per_token`` per token.

``tenants``, ``models``, ``reservations`` and ``gpu_budget`` are the rules of
``agents/policy/fleetmind/rules.py`` (read by ``fleetmind``; the other policies ignore them).
The parsed document itself is kept (``FleetSpec.document``): the simulator's judge of
violations (``sim/evaluation/violations.py``) reads the rules from it with code of its own,
never through the rules the policy decides with.
Every group has a count >= 1, and a fleet at most ``MAX_INSTANCES`` instances in all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from agents.policy.fleetmind.rules import FleetRules, parse_rules
from agents.policy.planners.shape import FleetShape, parse_shape
from agents.policy.types import ROLE_BOTH, ROLE_PREFILL, ROLES
from sim.engine.profiles import BUILT_IN, EngineProfile, ProfileSet


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    instance_id: str
    dc: str
    model: str
    version: str
    profile: EngineProfile
    price_per_hour: float | Literal["profile"] | None = "profile"  # None: no price
    role: str = ROLE_BOTH  # prefill | decode | both (``agents.policy.types.ROLES``)

    @property
    def price(self) -> float | None:
        """Cost of one hour of this instance, whatever it runs; None: no price (GPU-hours only)."""
        return self.profile.price_per_hour if self.price_per_hour == "profile" else self.price_per_hour


@dataclass(frozen=True, slots=True)
class Outage:
    """DC ``dc`` is cut off from ``down_s`` to ``up_s`` (simulated seconds from the workload's
    first arrival): its instances fail what they run, stop heartbeating, and come back cold."""

    dc: str
    down_s: float
    up_s: float


@dataclass(frozen=True, slots=True)
class FleetSpec:
    name: str
    instances: tuple[InstanceSpec, ...]
    rtt_s: dict[tuple[str, str], float] = field(default_factory=dict)
    ingress: str = ""
    dcs: tuple[str, ...] = ()  # every DC, with or without instances (default: the instances')
    rules: FleetRules = field(default_factory=FleetRules)
    outages: tuple[Outage, ...] = ()
    document: Mapping[str, Any] | None = None  # the fleet file as parsed (None: a COUNTxPROFILE spec)
    shape: FleetShape = field(default_factory=FleetShape)
    model_profiles: Mapping[str, EngineProfile] = field(default_factory=dict)  # a new replica's
    kv_link_gbps: Mapping[str, float] = field(default_factory=dict)  # per DC; absent: no link

    def profile_of(self, model: str) -> EngineProfile:
        """The engine profile a new replica of ``model`` runs (``models.NAME.profile``, else
        that of the model's first instance listed)."""
        if model in self.model_profiles:
            return self.model_profiles[model]
        return next(spec.profile for spec in self.instances if spec.model == model)

    def models(self) -> tuple[str, ...]:
        """Every model the fleet serves or may serve, in order of first mention."""
        return tuple(dict.fromkeys([*(spec.model for spec in self.instances), *self.model_profiles]))

    def gpu_budget(self, dc: str) -> int:
        """DC ``dc``'s GPU budget: its ``gpus``, else the GPUs of the instances listed there."""
        budget = self.shape.dc(dc).gpus
        if budget is not None:
            return budget
        return sum(spec.profile.gpus for spec in self.instances if spec.dc == dc)

    @property
    def dc_names(self) -> tuple[str, ...]:
        return self.dcs or tuple(dict.fromkeys(spec.dc for spec in self.instances))

    @property
    def ingress_dc(self) -> str:
        """Where requests enter: ``ingress``, else the first DC."""
        return self.ingress or self.dc_names[0]

    @property
    def default_model(self) -> str:
        """The model a request that names none is sent for (the first instance's)."""
        return self.instances[0].model

    def rtt(self, a: str, b: str) -> float:
        return 0.0 if a == b else self.rtt_s.get((a, b), 0.0)


_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9_.\-]+)\s*$")

MAX_INSTANCES = 100_000
"""Most instances a fleet may have in all (the simulator keeps each one in memory)."""


def _count(text: object, where: str, total: int) -> int:
    """A group's instance count: an integer >= 1 that keeps the fleet within ``MAX_INSTANCES``."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"{where}: count must be an integer >= 1, got {text!r}")
    digits = str(text).strip()
    if not digits.lstrip("-").isdigit():
        raise ValueError(f"{where}: count must be an integer >= 1, got {text!r}")
    if len(digits) > len(str(MAX_INSTANCES)) or total + int(digits) > MAX_INSTANCES:
        raise ValueError(f"{where}: a fleet has at most {MAX_INSTANCES} instances in all")
    count = int(digits)
    if count < 1:
        raise ValueError(f"{where}: count must be >= 1")
    return count


def parse_fleet(spec: str, profiles: ProfileSet = BUILT_IN) -> FleetSpec:
    """A fleet from ``N x profile [+ ...]`` or from a YAML file path, its profiles named among
    ``profiles`` (default: the built-in ones); ``ValueError`` if invalid."""
    if spec.endswith((".yaml", ".yml")) or _is_file(spec):
        return _fleet_from_yaml(Path(spec), profiles)
    groups = []
    total = 0
    for part in spec.split("+"):
        match = _GROUP.match(part)
        if not match:
            raise ValueError(f"bad fleet group {part!r}: expected COUNTxPROFILE, e.g. 8xllama3-8b-h100")
        count = _count(match.group(1), f"bad fleet group {part!r}", total)
        total += count
        groups.append((count, profiles.get(match.group(2))))
    model = profiles.model_of(groups[0][1])
    instances: list[InstanceSpec] = []
    for count, profile in groups:
        for _ in range(count):
            instances.append(InstanceSpec(f"i{len(instances):03d}", "dc-1", model, "1", profile))
    return FleetSpec(spec, tuple(instances))


Price = float | None | Literal["profile"]


def _price(where: dict[str, Any], what: str, inherited: Price = "profile") -> Price:
    """``price_per_hour`` of a data centre or instance group: a finite number >= 0, or null for
    no price (GPU-hours only); absent: ``inherited`` (the data centre's, else the profile's)."""
    if "price_per_hour" not in where:
        return inherited
    value = where["price_per_hour"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{what}: price_per_hour must be a number >= 0 or null, got {value!r}")
    return float(value)


def _is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _fleet_from_yaml(path: Path, profiles: ProfileSet) -> FleetSpec:
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read fleet file {path}: {exc}") from exc
    return fleet_from_doc(doc, path, profiles)


def fleet_from_doc(doc: Any, path: Path, profiles: ProfileSet = BUILT_IN) -> FleetSpec:
    """A fleet from a parsed YAML document (the module docstring's format), its profiles named
    among ``profiles``; ``path`` names it in errors and its file name is the fleet's name."""
    if not isinstance(doc, dict) or not isinstance(doc.get("data_centres"), list):
        raise ValueError(f"{path}: expected a mapping with a 'data_centres' list")
    instances: list[InstanceSpec] = []
    rtt: dict[tuple[str, str], float] = {}
    names: list[str] = []
    links: dict[str, float] = {}
    try:
        for dc in doc["data_centres"]:
            dc_name = str(dc["name"])
            names.append(dc_name)
            dc_price = _price(dc, f"data centre {dc_name!r}")
            if "kv_link_gbps" in dc:
                links[dc_name] = _link_gbps(dc["kv_link_gbps"], dc_name)
            for group in dc.get("instances") or []:
                profile = profiles.get(str(group["profile"]))
                model = str(group.get("model", profiles.model_of(profile)))
                version = str(group.get("version", "1"))
                count = _count(group.get("count", 1), f"{path}: data centre {dc_name!r}", len(instances))
                price = _price(group, f"data centre {dc_name!r}, group {profile.name}", dc_price)
                role = _role(group, dc_name, dc_name in links)
                for _ in range(count):
                    instances.append(
                        InstanceSpec(
                            f"{dc_name}/i{len(instances):03d}", dc_name, model, version, profile, price, role
                        )
                    )
        for a, row in (doc.get("rtt_ms") or {}).items():
            for b, ms in row.items():
                seconds = float(ms) / 1000.0
                if not math.isfinite(seconds) or seconds < 0:
                    raise ValueError(f"{path}: rtt_ms {a} -> {b} must be a finite number >= 0, got {ms!r}")
                rtt[(str(a), str(b))] = rtt[(str(b), str(a))] = seconds
        outages = tuple(
            Outage(str(o["dc"]), float(o["down_s"]), float(o["up_s"])) for o in doc.get("outages") or []
        )
        rules = parse_rules(doc)
        shape = parse_shape(doc)
        replica_profiles = {
            str(name): profiles.get(str(entry["profile"]))
            for name, entry in (doc.get("models") or {}).items()
            if isinstance(entry, dict) and "profile" in entry
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a fleet file ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not instances:
        raise ValueError(f"{path}: the fleet has no instances")
    for model in {spec.model for spec in instances}:
        if all(spec.role == ROLE_PREFILL for spec in instances if spec.model == model):
            raise ValueError(f"{path}: model {model!r} has only prefill instances: nothing decodes it")
    ingress = str(doc.get("ingress") or names[0])
    for name in [ingress, *(o.dc for o in outages)]:
        if name not in names:
            raise ValueError(f"{path}: {name!r} is not one of the data centres ({', '.join(names)})")
    for o in outages:
        if not 0 <= o.down_s < o.up_s:
            raise ValueError(f"{path}: outage of {o.dc}: need 0 <= down_s < up_s, got {o.down_s}, {o.up_s}")
    served = {spec.model for spec in instances} | set(replica_profiles)
    for dc_name, budget in shape.dcs.items():
        for model in budget.warm_models:
            if model not in served:
                raise ValueError(f"{path}: data centre {dc_name!r}: warm model {model!r} is not served")
    return FleetSpec(
        path.name,
        tuple(instances),
        rtt,
        ingress,
        tuple(names),
        rules,
        outages,
        doc,
        shape,
        replica_profiles,
        links,
    )


def _link_gbps(value: object, dc: str) -> float:
    """A DC's ``kv_link_gbps``: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"data centre {dc!r}: kv_link_gbps must be a number > 0, got {value!r}")
    return float(value)


def _role(group: dict[str, Any], dc: str, linked: bool) -> str:
    """An instance group's ``role`` (default ``both``); ``prefill`` only where the DC has a
    KV link to move what it computes."""
    role = str(group.get("role", ROLE_BOTH))
    if role not in ROLES:
        raise ValueError(f"data centre {dc!r}: role must be one of {', '.join(ROLES)}, got {role!r}")
    if role == ROLE_PREFILL and not linked:
        raise ValueError(f"data centre {dc!r}: a prefill group needs the DC's kv_link_gbps")
    return role
