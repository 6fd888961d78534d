"""Fleet specs: which instances exist, where, serving which model at which version.

Two forms:
- a string ``8xllama3-8b-h100`` (count x profile, several joined with ``+``): one data centre
  ``dc-1``, and every instance serves one model pool named after the first group's model, so a
  mixed string spec is a heterogeneous pool of one model;
- a YAML file::

      data_centres:
        - name: us-east
          instances:
            - {count: 4, profile: llama3-8b-h100, model: llama3-8b, version: "1"}
        - name: eu-west
          instances:
            - {count: 2, profile: llama3-8b-h100}
      rtt_ms:                 # round-trip time between data centres (symmetric)
        us-east: {eu-west: 80}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.engine.profiles import PROFILE_MODELS, EngineProfile, get_profile


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    instance_id: str
    dc: str
    model: str
    version: str
    profile: EngineProfile


@dataclass(frozen=True, slots=True)
class FleetSpec:
    name: str
    instances: tuple[InstanceSpec, ...]
    rtt_s: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def default_model(self) -> str:
        """The model a request that names none is sent for (the first instance's)."""
        return self.instances[0].model

    def rtt(self, a: str, b: str) -> float:
        return 0.0 if a == b else self.rtt_s.get((a, b), 0.0)


_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9_.\-]+)\s*$")


def parse_fleet(spec: str) -> FleetSpec:
    """A fleet from ``N x profile [+ ...]`` or from a YAML file path; ``ValueError`` if invalid."""
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        return _fleet_from_yaml(Path(spec))
    groups = []
    for part in spec.split("+"):
        match = _GROUP.match(part)
        if not match:
            raise ValueError(f"bad fleet group {part!r}: expected COUNTxPROFILE, e.g. 8xllama3-8b-h100")
        count, profile = int(match.group(1)), get_profile(match.group(2))
        if count < 1:
            raise ValueError(f"bad fleet group {part!r}: count must be >= 1")
        groups.append((count, profile))
    model = PROFILE_MODELS.get(groups[0][1].name, groups[0][1].name)
    instances: list[InstanceSpec] = []
    for count, profile in groups:
        for _ in range(count):
            instances.append(InstanceSpec(f"i{len(instances):03d}", "dc-1", model, "1", profile))
    return FleetSpec(spec, tuple(instances))


def _fleet_from_yaml(path: Path) -> FleetSpec:
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read fleet file {path}: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("data_centres"), list):
        raise ValueError(f"{path}: expected a mapping with a 'data_centres' list")
    instances: list[InstanceSpec] = []
    for dc in doc["data_centres"]:
        dc_name = str(dc["name"])
        for group in dc.get("instances", []):
            profile = get_profile(str(group["profile"]))
            model = str(group.get("model", PROFILE_MODELS.get(profile.name, profile.name)))
            version = str(group.get("version", "1"))
            for _ in range(int(group.get("count", 1))):
                instances.append(
                    InstanceSpec(f"{dc_name}/i{len(instances):03d}", dc_name, model, version, profile)
                )
    if not instances:
        raise ValueError(f"{path}: the fleet has no instances")
    rtt: dict[tuple[str, str], float] = {}
    for a, row in (doc.get("rtt_ms") or {}).items():
        for b, ms in row.items():
            rtt[(str(a), str(b))] = rtt[(str(b), str(a))] = float(ms) / 1000.0
    return FleetSpec(path.name, tuple(instances), rtt)
