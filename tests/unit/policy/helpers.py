"""Builders for the policy tests: snapshots, and one scheduler offer around a bare router."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

import numpy as np

from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.pipeline import Scheduler
from agents.policy.stages import InstanceSelectionStage
from agents.policy.types import ClusterView, Outcome, RequestView

_VERSIONS = count(1)


def cluster_view(
    n: int,
    *,
    ids: Sequence[str] | None = None,
    profile: str = "p",
    kv_total: int = 1000,
    heartbeats: Sequence[float] | None = None,
    **columns: Sequence[int],
) -> ClusterView:
    """``n`` ready instances ``i0..`` of model ``m`` in one DC; ``columns`` (``waiting``,
    ``running``, ``tokens``, ``kv_used``, ``kv_total``) default to 0 (``kv_total``: 1000).
    Every call is a new snapshot (a new version)."""

    def col(name: str, default: int = 0) -> np.ndarray:
        return np.array(columns.get(name, [default] * n), dtype=np.int64)

    return ClusterView(
        version=next(_VERSIONS),
        instance_ids=tuple(ids or [f"i{k}" for k in range(n)]),
        dc=np.array(["dc"] * n),
        model=np.array(["m"] * n),
        model_version=np.array(["1"] * n),
        profile=np.array([profile] * n),
        ready=np.ones(n, dtype=bool),
        waiting=col("waiting"),
        running=col("running"),
        tokens_in_flight=col("tokens"),
        kv_used=col("kv_used"),
        kv_total=col("kv_total", kv_total),
        last_heartbeat_s=np.zeros(n) if heartbeats is None else np.array(heartbeats, dtype=np.float64),
    )


def decide(
    router: InstanceSelectionStage, requests: Sequence[RequestView], view: ClusterView, now_s: float
) -> list[Outcome]:
    """``requests`` offered once through a scheduler made of the default stages and ``router``."""
    return Scheduler(router.name, PassThrough(), HomeDc(), router).submit(requests, view, now_s)
