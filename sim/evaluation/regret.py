"""Regret of admission: the work a policy turned away that it need not have.

For a policy with an admission stage (``slomax+tokenpilot``), its *pass-through twin* is the same
stages without admission (``tokenpilot``), run in the same command on the same workload, seed and
clients. Then, per SLO class and in total,

    rejected_met_without_admission = |{requests the policy rejected (at arrival, or held until
                                      they expired)} & {requests the twin completed within their
                                      objective}|

A request counts as rejected when its last attempt was rejected by the scheduler (a client that
gave up on a held request and did not retry is an abort, not a reject). The count is made from
the two runs' per-request outcomes alone: nothing of the policy's own reasons is read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agents.policy.registry import parse_policy
from sim.evaluation.metrics import RequestOutcome

PASS_THROUGH = "pass-through"
_DEFAULT_DC = "home-dc"


def pass_through_twin(policy: str) -> str | None:
    """The policy's stages without its admission stage; None if it has no admission stage."""
    admission, dc, instance = parse_policy(policy)
    if admission == PASS_THROUGH:
        return None
    return instance if dc == _DEFAULT_DC else f"{dc}+{instance}"


def rejected_met_without_admission(
    judged: Sequence[RequestOutcome], twin: Sequence[RequestOutcome]
) -> dict[str, int]:
    """Per class (every class of ``judged``, zeros included) and under ``"all"``: the count of
    the module docstring."""
    met = {r.request_id for r in twin if r.good}
    regret = Counter(r.slo_class for r in judged if r.status == "rejected" and r.request_id in met)
    counts = {name: regret.get(name, 0) for name in sorted({r.slo_class for r in judged})}
    counts["all"] = sum(regret.values())
    return counts
