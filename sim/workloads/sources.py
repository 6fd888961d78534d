"""Resolve a ``--workload`` argument: a trace file or ``synthetic[:key=value,...]``."""

from __future__ import annotations

from dataclasses import fields

from sim.workloads.synthetic import SyntheticMix
from sim.workloads.trace import Workload, load_records, load_workload

_NUMERIC = {f.name: f.type for f in fields(SyntheticMix) if f.type in ("float", "int")}
_MODELS = "models"


def open_workload(spec: str, seed: int = 0) -> Workload:
    """``synthetic`` takes the numeric keys of ``SyntheticMix`` (e.g.
    ``synthetic:duration_s=300,rate_per_s=6``) and ``models``, joined with ``+`` as the groups
    of a fleet spec are (``models=llama3-8b@2+qwen3-14b``: tenants alternate between them)."""
    if spec != "synthetic" and not spec.startswith("synthetic:"):
        return load_workload(spec)
    options: dict[str, float | int | tuple[str, ...]] = {"seed": seed}
    for item in filter(None, spec.partition(":")[2].split(",")):
        key, _, value = item.partition("=")
        if key == _MODELS:
            options[key] = tuple(value.split("+"))
            continue
        if key not in _NUMERIC:
            raise ValueError(f"unknown synthetic option {key!r}; known: {', '.join([*_NUMERIC, _MODELS])}")
        options[key] = int(value) if _NUMERIC[key] == "int" else float(value)
    mix = SyntheticMix(**options)  # type: ignore[arg-type]
    return load_records(mix.generate(), name=spec)
