"""Token-weighted fair queuing between tenants (the Virtual Token Counter of Sheng et al.,
"Fairness in Serving Large Language Models", OSDI 2024).

Each tenant has a counter of the service it received, weighted:

    counter[t] += (input_weight · input tokens + output_weight · output tokens) / weight[t]

charged when a request is admitted (its output budget as the estimate) and corrected when it
finishes (the output it really produced). Held requests are served lowest counter first, so a
tenant that floods the cluster only waits behind its own backlog. A tenant that was idle comes
back at the lowest counter among the tenants with work (not at its old, low one), so idleness
earns no credit to burst with later.

Counters order work; they do not make room for it. ``under_share`` names the tenants another's
flood crowds out of the pool (max-min fairness over tokens in flight), whom SLOMax serves first
and whose batch work it lets past the saturated batch gate (``admission.py``'s docstring).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


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


CROWDED_OUT = 0.5
"""How far below its part a tenant must be to count as crowded out. Tenants of equal demand
drift around their parts all the time, and at 1.0 (any tenant below its part) the rule reorders
equal tenants constantly and costs goodput (docs/results/slomax.md, "Fairness")."""


def under_share(
    holds: Mapping[str, int], waiting: Iterable[str], weights: Mapping[str, float]
) -> dict[str, int]:
    """The tenants crowded out: below ``CROWDED_OUT`` x their fair part of the pool's work while
    another tenant is above its own, each with its part in tokens (empty when none is).

        part[t] = weight[t] / (sum of the weights of the tenants with work) x sum of ``holds``

    ``holds``: each tenant's tokens in flight (input + output budget); a tenant has work when it
    holds some or is ``waiting``. Max-min fair: a tenant asking less than its part is owed all it
    asks, so while another tenant holds more than its part, the crowded-out ones go first.
    With one tenant nobody is above its part.
    """
    tenants = {t for t, n in holds.items() if n > 0} | set(waiting)
    pool = sum(holds.get(t, 0) for t in tenants)
    total = sum(weights.get(t, 1.0) for t in tenants)
    part = {t: weights.get(t, 1.0) / total * pool for t in tenants}
    if not any(holds.get(t, 0) > part[t] for t in tenants):
        return {}
    return {t: int(part[t]) for t in tenants if holds.get(t, 0) < CROWDED_OUT * part[t]}
