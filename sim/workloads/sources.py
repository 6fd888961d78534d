"""Resolve a ``--workload`` argument: a trace file or ``synthetic[:key=value,...]``."""

from __future__ import annotations

from dataclasses import fields

from sim.workloads.synthetic import SyntheticMix
from sim.workloads.trace import Workload, load_records, load_workload

_NUMERIC = {f.name: f.type for f in fields(SyntheticMix) if f.type in ("float", "int")}
_MODELS = "models"
_NUMBER_LISTS = ("phases", "model_shares")  # one number per model, joined with "+"


def open_workload(spec: str, seed: int = 0) -> Workload:
    """``synthetic`` takes the numeric keys of ``SyntheticMix`` (e.g.
    ``synthetic:duration_s=300,rate_per_s=6``) and ``models``, joined with ``+`` as the groups
    of a fleet spec are (``models=llama3-8b@2+qwen3-14b``: tenants alternate between them), and
    for a day of several models ``phases`` and ``model_shares``, one number per model joined the
    same way (``synthetic:duration_s=7200,day_s=7200,swing=0.8,models=a+b,phases=0.25+0.75``)."""
    if spec != "synthetic" and not spec.startswith("synthetic:"):
        return load_workload(spec)
    options: dict[str, float | int | tuple[str, ...] | tuple[float, ...]] = {"seed": seed}
    for item in filter(None, spec.partition(":")[2].split(",")):
        key, _, value = item.partition("=")
        if key == _MODELS:
            options[key] = tuple(value.split("+"))
        elif key in _NUMBER_LISTS:
            options[key] = tuple(_number(key, v) for v in value.split("+"))
        elif key in _NUMERIC:
            options[key] = int(value) if _NUMERIC[key] == "int" else float(value)
        else:
            known = ", ".join([*_NUMERIC, _MODELS, *_NUMBER_LISTS])
            raise ValueError(f"unknown synthetic option {key!r}; known: {known}")
    mix = SyntheticMix(**options)  # type: ignore[arg-type]
    return load_records(mix.generate(), name=spec)


def _number(key: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"synthetic {key} must be numbers joined with '+', got {text!r}") from None
