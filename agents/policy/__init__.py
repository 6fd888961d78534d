"""The pure decision core: numpy and plain data only (no Kafka, no ClickHouse, no simulator).

``make_policy(name, seed)`` builds any routing policy by the name the CLI and settings use.
"""

from __future__ import annotations

from agents.policy.baselines import LeastRequest, LeastTokens, RandomChoice, RoundRobin
from agents.policy.common.selector import RoutingPolicy
from agents.policy.peers import DynamoKv, LlmdDefault, SglangCacheAware
from agents.policy.tokenpilot.router import TokenPilot
from agents.policy.types import Policy

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomChoice,
        LeastRequest,
        LeastTokens,
        SglangCacheAware,
        DynamoKv,
        LlmdDefault,
        TokenPilot,
    )
}


def make_policy(name: str, seed: int = 0) -> Policy:
    """A fresh policy instance; raises ``KeyError`` naming the known policies if unknown."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return cls(seed=seed)


__all__ = ["POLICIES", "Policy", "make_policy"]
