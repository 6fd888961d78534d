"""Replica placement advice from a sustained mismatch between demand and capacity.

Every ``sample_s`` the fleet-wide load of a model version (tokens in flight / tokens its ready
instances can hold, over every DC) is sampled; over the last ``window_s``:

- mean load ≥ ``high``: advise +1 instance in the DC that can host one (``gpu_slots`` above what
  it runs) whose failure domain holds the fewest instances of the model version (spread across
  failure domains), nearest the ingress on ties — while the fleet stays within ``gpu_budget``;
- mean load ≤ ``low`` with more than one instance: advise -1 in the DC with the most instances
  of it (never its last one in a failure domain that has no other).

After advice, the window starts again (no advice twice for the same evidence). Advice is only
published (``replica_advice`` notices): an operator, or a placement controller, acts on it.
With ``gpu_budget`` 0 (unknown), no advice is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.fleetmind.rules import FleetRules


class PlacementAdvisor:
    def __init__(
        self,
        rules: FleetRules,
        rtt: Callable[[str], float],
        window_s: float = 60.0,
        sample_s: float = 1.0,
        high: float = 0.8,
        low: float = 0.2,
    ) -> None:
        self.rules, self.rtt = rules, rtt
        self.window_s, self.sample_s, self.high, self.low = window_s, sample_s, high, low
        self._samples: dict[tuple[str, str], deque[tuple[float, float]]] = {}

    def sample(
        self, model: str, version: str, capacities: dict[str, DcCapacity], now_s: float
    ) -> list[FleetNotice]:
        if self.rules.gpu_budget <= 0 or not capacities:
            return []
        samples = self._samples.setdefault((model, version), deque())
        if samples and now_s - samples[-1][0] < self.sample_s:
            return []
        capacity = sum(c.token_capacity for c in capacities.values())
        flight = sum(c.tokens_in_flight for c in capacities.values())
        samples.append((now_s, flight / capacity if capacity else 1.0))
        while samples and now_s - samples[0][0] > self.window_s:
            samples.popleft()
        if now_s - samples[0][0] < self.window_s * 0.95:
            return []  # not yet a sustained window of evidence
        mean = sum(load for _, load in samples) / len(samples)
        notice = None
        if mean >= self.high:
            notice = self._grow(model, version, capacities, mean, now_s)
        elif mean <= self.low:
            notice = self._shrink(model, version, capacities, mean, now_s)
        if notice is None:
            return []
        samples.clear()
        return [notice]

    def _grow(
        self, model: str, version: str, caps: dict[str, DcCapacity], mean: float, now_s: float
    ) -> FleetNotice | None:
        deployed = sum(c.deployed for c in caps.values())
        if deployed >= self.rules.gpu_budget:
            return None
        per_domain: dict[str, int] = {}
        for dc, cap in caps.items():
            domain = self._domain(dc)
            per_domain[domain] = per_domain.get(domain, 0) + cap.deployed
        hosts = [
            info.name
            for info in self.rules.dcs.values()
            if info.gpu_slots > (caps[info.name].deployed if info.name in caps else 0)
        ]
        if not hosts:
            return None
        dc = min(hosts, key=lambda d: (per_domain.get(self._domain(d), 0), self.rtt(d), d))
        return FleetNotice(
            "replica_advice", dc, model, version, now_s,
            f"fleet load {mean:.2f} >= {self.high} over {self.window_s:g} s; {deployed} of a "
            f"{self.rules.gpu_budget}-instance budget deployed",
            delta=1, replicas=(caps[dc].deployed if dc in caps else 0) + 1,
        )  # fmt: skip

    def _shrink(
        self, model: str, version: str, caps: dict[str, DcCapacity], mean: float, now_s: float
    ) -> FleetNotice | None:
        if sum(c.deployed for c in caps.values()) <= 1:
            return None
        per_domain: dict[str, int] = {}
        for dc, cap in caps.items():
            per_domain[self._domain(dc)] = per_domain.get(self._domain(dc), 0) + cap.deployed
        shrinkable = [dc for dc, cap in caps.items() if cap.deployed > 1 or per_domain[self._domain(dc)] > 1]
        if not shrinkable:
            return None
        dc = max(shrinkable, key=lambda d: (caps[d].deployed, d))
        return FleetNotice(
            "replica_advice", dc, model, version, now_s,
            f"fleet load {mean:.2f} <= {self.low} over {self.window_s:g} s", delta=-1,
            replicas=caps[dc].deployed - 1,
        )  # fmt: skip

    def _domain(self, dc: str) -> str:
        info = self.rules.dcs.get(dc)
        return dc if info is None else info.failure_domain
