"""Where a request let past a gate may go (the rule in ``admission.py``'s docstring).

A gate that would hold a request is waived when the request is due or nothing waits; the
request then still goes only to rows where it most likely meets its objective:

    rows = allowed & (waited + high(ttft) <= objective)

with ``high`` the high end of its prediction's observed error (``errors.py``: the larger of a
ratio and a lateness in seconds). With several deciders, when
not even its own prefill alone (``own``, as on an idle instance) meets the objective at the high
end on any allowed row, a hold could only end in ``expired``, so the point prediction decides:

    rows = allowed & (waited + ttft <= objective)

(a decider's observed error then mostly counts the other deciders' unseen placements of the
same instant; docs/results/scoreboard.md, "Several deciders per pool").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray
from agents.policy.slomax.errors import ErrorBounds
from agents.policy.types import RowPrediction


def at_best(predicted: RowPrediction, rows: BoolArray | None = None) -> tuple[float, float]:
    """(TTFT, own prefill) on the row of ``rows`` (None: any) with the lowest predicted TTFT:
    where the router most likely sends the request."""
    ttft = predicted.ttft_s if rows is None else np.where(rows, predicted.ttft_s, np.inf)
    if not len(ttft):
        return np.inf, 0.0
    row = int(np.argmin(ttft))
    return float(ttft[row]), float(predicted.own_s[row])


@dataclass(frozen=True, slots=True)
class Waiver:
    """What letting a request past a gate needs: its class, prediction, wait, objective, the
    observed error of its prediction, and why it may pass (it is due, or nothing waits)."""

    slo_class: str
    predicted: RowPrediction
    waited: float
    objective: float
    error: ErrorBounds
    why: str

    def meets(self, ttft: FloatArray) -> BoolArray:
        """Per row: a TTFT of ``ttft`` meets the objective even at the high end of its error."""
        return self.waited + self.error.at_most(ttft) <= self.objective

    def rows(self, allowed: BoolArray, several_deciders: bool) -> BoolArray:
        """The rows of ``allowed`` it may go to (module docstring); none: it stays held."""
        ttft = self.predicted.ttft_s
        rows = allowed & self.meets(ttft)
        if not rows.any() and several_deciders and self._out_of_reach(allowed):
            rows = allowed & (self.waited + ttft <= self.objective)
        return rows

    def _out_of_reach(self, allowed: BoolArray) -> bool:
        """No row of ``allowed`` meets the high end even for the request's own prefill alone."""
        return not (allowed & self.meets(self.predicted.own_s)).any()
