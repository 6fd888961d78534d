"""Multi-DC scenarios: a fleet YAML and a workload in one file, run by ``simulate --scenario``.

A scenario file (``sim/scenarios/NAME.yaml``, or any path)::

    description: one line
    fleet: {...}             # a fleet document (sim/engine/fleet.py: DCs, RTTs, rules, outages)
    workload:                # traffic sources, each a synthetic mix (sim/workloads/synthetic.py)
      - {name: b, home_dc: B, duration_s: 300, rate_per_s: 5}
      - {name: hot, home_dc: B, start_s: 90, duration_s: 120, rate_per_s: 6, hotspot: true}
      - {name: bank, tenant: bank, home_dc: B, duration_s: 300, rate_per_s: 1}

A source is a ``SyntheticMix`` (its keys: ``duration_s``, ``rate_per_s``, ``tenants``, shares,
``batch_jobs_per_hour``, ``models`` ...) starting at ``start_s``, whose requests enter at ``home_dc``, with
tenants named ``NAME/tenant-K`` (or all ``tenant``), optional ``model_version`` and
``allowed_regions``. Sources get disjoint block ids (no false sharing between them) and seeds
``seed + index``. ``hotspot: true`` marks the sources of a hot spot; their span is the
scenario's hot-spot window, judged on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from sim.engine.fleet import FleetSpec, fleet_from_doc
from sim.workloads.synthetic import SyntheticMix
from sim.workloads.trace import Workload, load_records

SCENARIO_DIR = Path(__file__).parent
_MIX_KEYS = {f.name for f in fields(SyntheticMix)} - {"seed"}
_SOURCE_KEYS = {"name", "home_dc", "start_s", "tenant", "hotspot", "model_version", "allowed_regions"}
_BLOCK_SPACE = 10**9  # block ids of source k are shifted by (k + 1) x this


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    fleet: FleetSpec
    workload: Workload
    hotspot: tuple[float, float] | None  # seconds from the first arrival


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name: str, seed: int = 0) -> Scenario:
    """A shipped scenario by name, or a scenario file by path; ``ValueError`` naming what is wrong."""
    path = Path(name)
    if not path.is_file():
        path = SCENARIO_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown scenario {name!r}; shipped: {', '.join(scenario_names())}")
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read scenario {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("workload"), list) or not doc["workload"]:
        raise ValueError(f"{path}: expected a mapping with 'fleet' and a non-empty 'workload' list")
    fleet = fleet_from_doc(doc.get("fleet"), path)
    records: list[dict[str, Any]] = []
    hot: list[tuple[float, float]] = []
    for index, source in enumerate(doc["workload"]):
        records += _source_records(path, index, source, seed, fleet)
        if isinstance(source, dict) and source.get("hotspot"):
            start = float(source.get("start_s", 0.0))
            hot.append((start, start + float(source.get("duration_s", 600.0))))
    records.sort(key=lambda r: float(r["timestamp"]))
    workload = load_records(records, name=path.stem)
    first = min(float(r["timestamp"]) for r in records) / 1000.0
    window = (min(h[0] for h in hot) - first, max(h[1] for h in hot) - first) if hot else None
    return Scenario(path.stem, str(doc.get("description", "")), fleet, workload, window)


def _source_records(
    path: Path, index: int, source: object, seed: int, fleet: FleetSpec
) -> list[dict[str, Any]]:
    where = f"{path}: workload[{index}]"
    if not isinstance(source, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = sorted(set(source) - _MIX_KEYS - _SOURCE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {', '.join(unknown)}")
    home = str(source.get("home_dc", fleet.ingress_dc))
    if home not in fleet.dc_names:
        raise ValueError(f"{where}: home_dc {home!r} is not a data centre of the fleet")
    mix_options = {k: v for k, v in source.items() if k in _MIX_KEYS}
    for listed in ("batch_job_size", "models", "phases", "model_shares"):  # YAML lists; the mix takes tuples
        if isinstance(mix_options.get(listed), list):
            mix_options[listed] = tuple(mix_options[listed])
    try:
        mix = SyntheticMix(seed=seed + index, **mix_options)
        start_ms = float(source.get("start_s", 0.0)) * 1000.0
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    name = str(source.get("name", f"s{index}"))
    shift = (index + 1) * _BLOCK_SPACE
    records: list[dict[str, Any]] = []
    for record in mix.generate():
        record = dict(record)
        record["timestamp"] = float(record["timestamp"]) + start_ms
        record["request_id"] = f"{name}-{record.get('request_id', len(records))}"
        record["tenant"] = str(source.get("tenant") or f"{name}/{record.get('tenant', 'default')}")
        record["hash_ids"] = [shift + int(i) for i in record.get("hash_ids") or []]
        record["home_dc"] = home
        if "model_version" in source:
            record["model_version"] = str(source["model_version"])
        if "allowed_regions" in source:
            record["allowed_regions"] = [str(r) for r in source["allowed_regions"]]
        records.append(record)
    return records
