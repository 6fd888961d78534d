"""What a compliant token cost: GPU time and money per policy, SLO class and tenant.

Capacity is paid for whether it works or not: instance i costs ``price_i`` per hour for the
``held_i`` seconds of the measurement window W it holds its GPUs (the whole of W for a fleet
that never changes; from its start to its stop for a replica a planner adds or removes; its
``InstanceSpec.price``; None when the fleet gives no price, then only GPU-seconds are reported).
Over W each instance is busy ``busy_i`` seconds (running engine steps) and idle the rest of
``held_i``.

Attribution (``Instance._account_busy``): every engine step's busy time is shared among the
requests in the step by the tokens each computed in it, a prefill chunk of c tokens counting c
and a decoder one per step. So the attempts' shares add up to the instances' busy time, and a
long prompt pays for the steps its chunks fill. GPU-seconds are instance-seconds x the
profile's GPUs; money is instance-seconds x price / 3600.

Per policy (``total``):
    gpu_seconds_busy, gpu_seconds_idle      sum over instances (idle is reported apart: it is
                                            not any tenant's and not hidden in their figures)
    cost                                    sum over instances of held_i x price_i / 3600
    cost_per_million_goodput_tokens         cost / goodput tokens x 10^6 (busy and idle)
    wasted_gpu_seconds                      attributed busy GPU-seconds of attempts that
                                            delivered no compliant output: every attempt of a
                                            request that did not meet its objective (aborted,
                                            timed out, failed, or finished outside it), and the
                                            earlier attempts of one that did (retried)
Per class and per tenant the same from the attributed busy time only (no idle share):
``gpu_seconds_busy``, ``cost`` (attributed), ``cost_per_million_goodput_tokens`` (its attributed
cost / its goodput tokens), ``wasted_gpu_seconds``. None where there is no price or no goodput.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sim.engine.attempt import Attempt
from sim.engine.fleet import InstanceSpec
from sim.evaluation.metrics import RequestOutcome

Figures = dict[str, float | None]


@dataclass(slots=True)
class _Tally:
    busy_gpu_s: float = 0.0
    cost: float = 0.0
    wasted_gpu_s: float = 0.0
    good_tokens: int = 0

    def figures(self, priced: bool) -> Figures:
        cost = self.cost if priced else None
        per_million = cost / self.good_tokens * 1e6 if cost is not None and self.good_tokens else None
        return {
            "gpu_seconds_busy": round(self.busy_gpu_s, 6),
            "cost": None if cost is None else round(cost, 6),
            "cost_per_million_goodput_tokens": None if per_million is None else round(per_million, 6),
            "wasted_gpu_seconds": round(self.wasted_gpu_s, 6),
        }


def costs(
    attempts: Sequence[Attempt],
    requests: Sequence[RequestOutcome],
    instances: Sequence[InstanceSpec],
    busy_s: Sequence[float],
    held_s: Sequence[float],
) -> dict[str, object]:
    """``{"total": ..., "per_class": {CLASS: ...}, "per_tenant": {TENANT: ...}}`` (module
    docstring); ``requests`` are the judged outcomes of the run's cohort, ``busy_s`` and
    ``held_s`` the instances' busy and held seconds in the window, in ``instances``' order."""
    priced = all(spec.price is not None for spec in instances)
    outcome = {r.request_id: r for r in requests}
    by_request: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.request.request_id in outcome:
            by_request[attempt.request.request_id].append(attempt)
    per_class: dict[str, _Tally] = defaultdict(_Tally)
    per_tenant: dict[str, _Tally] = defaultdict(_Tally)
    total = _Tally()
    for request_id, tries in by_request.items():
        tries.sort(key=lambda a: a.attempt)
        judged = outcome[request_id]
        first = tries[0].request
        tallies = (per_class[judged.slo_class], per_tenant[first.tenant], total)
        for tally in tallies:
            tally.good_tokens += judged.good_tokens
        for attempt in tries:
            if attempt.instance is None or not attempt.busy_s:
                continue
            spec = attempt.instance.spec
            gpu_s = attempt.busy_s * spec.profile.gpus
            money = attempt.busy_s * (spec.price or 0.0) / 3600.0
            wasted = not judged.good or attempt is not tries[-1]
            for tally in tallies[:2]:  # the total's busy time and cost come from the instances
                tally.busy_gpu_s += gpu_s
                tally.cost += money
                tally.wasted_gpu_s += gpu_s if wasted else 0.0
            total.wasted_gpu_s += gpu_s if wasted else 0.0
    total.busy_gpu_s = sum(b * spec.profile.gpus for b, spec in zip(busy_s, instances, strict=True))
    total.cost = sum(h * (spec.price or 0.0) / 3600.0 for h, spec in zip(held_s, instances, strict=True))
    idle = sum((h - b) * spec.profile.gpus for h, b, spec in zip(held_s, busy_s, instances, strict=True))
    return {
        "total": {**total.figures(priced), "gpu_seconds_idle": round(idle, 6)},
        "per_class": {name: t.figures(priced) for name, t in sorted(per_class.items())},
        "per_tenant": {name: t.figures(priced) for name, t in sorted(per_tenant.items())},
    }
