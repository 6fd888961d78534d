"""SLOMax's classification: which SLO class and tier a request belongs to (configuration).

    class  = tenant override, else the class the request declares, else
             ``batch`` for a batch task type, ``long_context`` above ``long_input_tokens`` input
             tokens (or ``long_output_tokens`` of output budget), else ``interactive``
    tier   = the tenant's tier (``tenant_tiers``), else ``default_tier``; tier 0 is served first
    weight = the tenant's fair-share weight (``tenant_weights``, default 1)

Thresholds are configuration, not code: every rule is a constructor argument, so a YAML policy
config (``slomax: {long_input_tokens: 16384, tenant_tiers: {acme: 0}}``) can change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.policy.common.slo import BATCH, INTERACTIVE, LONG_CONTEXT, LONG_CONTEXT_INPUT_TOKENS
from agents.policy.types import RequestView

CLASSES = (INTERACTIVE, LONG_CONTEXT, BATCH)
"""The classes SLOMax keeps a queue pool for, in the order it serves them within a tier."""


@dataclass(frozen=True, slots=True)
class Classified:
    """What SLOMax knows of a request before deciding: its class, tier and tenant weight."""

    slo_class: str
    tier: int
    weight: float


@dataclass(frozen=True, slots=True)
class ClassRules:
    long_input_tokens: int = LONG_CONTEXT_INPUT_TOKENS
    long_output_tokens: int | None = None
    batch_task_types: frozenset[str] = frozenset({"batch"})
    tenant_tiers: Mapping[str, int] = field(default_factory=dict)
    tenant_classes: Mapping[str, str] = field(default_factory=dict)  # tenant -> forced class
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_tier: int = 1

    def __post_init__(self) -> None:
        unknown = sorted(set(self.tenant_classes.values()) - set(CLASSES))
        if unknown:
            raise ValueError(f"tenant_classes name unknown classes {unknown}; known: {', '.join(CLASSES)}")
        bad = sorted(t for t, w in self.tenant_weights.items() if not w > 0)
        if bad:
            raise ValueError(f"tenant_weights must be > 0, not for {bad}")

    def classify(self, request: RequestView) -> Classified:
        tenant = request.tenant
        slo_class = self.tenant_classes.get(tenant) or self._by_request(request)
        return Classified(
            slo_class,
            self.tenant_tiers.get(tenant, self.default_tier),
            self.tenant_weights.get(tenant, 1.0),
        )

    def _by_request(self, request: RequestView) -> str:
        if request.slo_class in CLASSES:
            return request.slo_class
        if request.task_type in self.batch_task_types:
            return BATCH
        if request.input_tokens > self.long_input_tokens:
            return LONG_CONTEXT
        if self.long_output_tokens is not None and request.output_budget > self.long_output_tokens:
            return LONG_CONTEXT
        return INTERACTIVE
