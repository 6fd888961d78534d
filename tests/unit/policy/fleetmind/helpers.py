"""Builders for the FleetMind tests: multi-DC snapshots, requests, schedulers and capacities."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np

from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.rules import FleetRules
from agents.policy.pipeline import Scheduler
from agents.policy.registry import build_scheduler
from agents.policy.types import ClusterView, DcView, Outcome, RequestView

_VERSIONS = count(1_000_000)  # apart from tests/unit/policy/helpers.py's counter


@dataclass(frozen=True, slots=True)
class Inst:
    """One instance of a snapshot: where it is, what it serves, its state and its last heartbeat."""

    dc: str
    model: str = "m"
    version: str = "v1"
    ready: bool = True
    tokens: int = 0
    kv_total: int = 1000
    heartbeat_s: float = 0.0
    running: int = 0
    waiting: int = 0


def fleet_view(
    instances: Sequence[Inst],
    rtt: Mapping[str, float] | None = None,
    unreachable: Sequence[str] = (),
    version: int | None = None,
) -> ClusterView:
    """A snapshot with one row per instance, ids ``<dc>-<k>``; the DcView lists every DC of the
    instances and of ``rtt`` (rtt 0 unless given). Every call is a new snapshot version unless
    ``version`` is given."""
    names = sorted({i.dc for i in instances} | set(rtt or {}) | set(unreachable))
    dcs = DcView(
        tuple(names),
        tuple((rtt or {}).get(d, 0.0) for d in names),
        tuple(d not in unreachable for d in names),
    )
    per_dc: dict[str, int] = {}
    ids = []
    for inst in instances:
        k = per_dc.get(inst.dc, 0)
        per_dc[inst.dc] = k + 1
        ids.append(f"{inst.dc}-{k}")

    def ints(values: Sequence[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    return ClusterView(
        version=next(_VERSIONS) if version is None else version,
        instance_ids=tuple(ids),
        dc=np.array([i.dc for i in instances], dtype=str),
        model=np.array([i.model for i in instances], dtype=str),
        model_version=np.array([i.version for i in instances], dtype=str),
        profile=np.array(["p"] * len(instances), dtype=str),
        ready=np.array([i.ready for i in instances], dtype=bool),
        waiting=ints([i.waiting for i in instances]),
        running=ints([i.running for i in instances]),
        tokens_in_flight=ints([i.tokens for i in instances]),
        kv_used=ints([0] * len(instances)),
        kv_total=ints([i.kv_total for i in instances]),
        last_heartbeat_s=np.array([i.heartbeat_s for i in instances], dtype=np.float64),
        dcs=dcs,
    )


def request(
    rid: str,
    tenant: str = "t",
    model: str = "m",
    *,
    home: str = "",
    regions: tuple[str, ...] = (),
    version: str = "",
    tokens: int = 1000,
    blocks: tuple[int, ...] = (),
    arrival_s: float = 0.0,
) -> RequestView:
    return RequestView(
        rid, 1, tenant, model, "interactive", tokens, 64, blocks, arrival_s,
        allowed_regions=regions, home_dc=home, model_version=version,
    )  # fmt: skip


def fleetmind(
    rules: FleetRules | Mapping[str, Any] | None = None, router: str = "least-tokens", **params: Any
) -> Scheduler:
    """``fleetmind+<router>`` from the registry, with ``rules`` and other FleetMind parameters."""
    return build_scheduler(
        f"fleetmind+{router}", params={"fleetmind": {"rules": rules or {}, "heartbeat_s": 0.25, **params}}
    )


def one(scheduler: Scheduler, req: RequestView, view: ClusterView, now_s: float) -> Outcome:
    """The single outcome of submitting ``req``."""
    (outcome,) = scheduler.submit([req], view, now_s)
    return outcome


def capacity(
    dc: str, ready: int, deployed: int | None = None, tokens: int = 0, per_instance: int = 1000
) -> DcCapacity:
    """A DcCapacity without rows (for the health, reservation and advice units)."""
    return DcCapacity(
        dc=dc,
        rows=np.zeros(0, dtype=bool),
        deployed=ready if deployed is None else deployed,
        ready=ready,
        tokens_in_flight=tokens,
        token_capacity=ready * per_instance,
        waiting=0,
    )
