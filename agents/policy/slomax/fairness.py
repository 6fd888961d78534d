"""Token-weighted fair queuing between tenants (the Virtual Token Counter of Sheng et al.,
"Fairness in Serving Large Language Models", OSDI 2024).

Each tenant has a counter of the service it received, weighted:

    counter[t] += (input_weight · input tokens + output_weight · output tokens) / weight[t]

charged when a request is admitted (its output budget as the estimate) and corrected when it
finishes (the output it really produced). Held requests are served lowest counter first, so a
tenant that floods the cluster only waits behind its own backlog. A tenant that was idle comes
back at the lowest counter among the tenants with work (not at its old, low one), so idleness
earns no credit to burst with later.
"""

from __future__ import annotations

from collections.abc import Iterable


class VirtualTokenCounter:
    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counters: dict[str, float] = {}
        self._charged: dict[tuple[str, int], tuple[str, float, int]] = {}  # key -> tenant, weight, budget

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def lift(self, tenant: str, backlogged: Iterable[str]) -> None:
        """A tenant (re)appearing with work starts no lower than the lowest counter of the
        ``backlogged`` tenants (those that kept work waiting meanwhile)."""
        floor = min((self.counters[t] for t in backlogged if t in self.counters and t != tenant), default=0.0)
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def charge(
        self, key: tuple[str, int], tenant: str, weight: float, input_tokens: int, budget: int
    ) -> None:
        cost = self.input_weight * input_tokens + self.output_weight * budget
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / weight
        self._charged[key] = (tenant, weight, budget)

    def settle(self, key: tuple[str, int], output_tokens: int) -> None:
        """Replace the charged output budget by the output produced (idempotent)."""
        charged = self._charged.pop(key, None)
        if charged is not None:
            tenant, weight, budget = charged
            self.counters[tenant] -= self.output_weight * (budget - output_tokens) / weight
