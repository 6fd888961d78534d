"""SLO classes: named thresholds. Configuration, not code: tenants and settings may override."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloClass:
    """Thresholds a request must meet to count towards goodput.

    ``ttft_s`` / ``tpot_s``: upper bounds (None = no bound). ``deadline`` classes (batch) are
    met when the request finished before its own deadline. ``client_timeout_s``: how long the
    client waits for the first token before giving up (None = until its deadline).
    """

    name: str
    ttft_s: float | None
    tpot_s: float | None
    deadline: bool = False
    client_timeout_s: float | None = None

    def give_up_at(self, arrival_s: float, deadline_s: float | None) -> float | None:
        """When a client of this class gives up on an attempt that has no first token (deadline
        classes: at the absolute ``deadline_s`` even mid-stream); None = it waits for ever."""
        if self.deadline:
            return deadline_s
        return None if self.client_timeout_s is None else arrival_s + self.client_timeout_s


INTERACTIVE, LONG_CONTEXT, BATCH = "interactive", "long_context", "batch"
"""The default classes' names (every stage that treats a class apart names it by these)."""

DEFAULT_SLO_CLASSES: dict[str, SloClass] = {
    INTERACTIVE: SloClass(INTERACTIVE, ttft_s=2.0, tpot_s=0.1, client_timeout_s=10.0),
    LONG_CONTEXT: SloClass(LONG_CONTEXT, ttft_s=15.0, tpot_s=0.15, client_timeout_s=60.0),
    BATCH: SloClass(BATCH, ttft_s=None, tpot_s=None, deadline=True),
}

LONG_CONTEXT_INPUT_TOKENS = 32_768
"""The fixed classification rule: input above this is ``long_context`` unless the trace says."""


def classify(input_tokens: int, declared: str | None) -> str:
    """SLO class of a request: the declared one if any, else by input length."""
    if declared:
        return declared
    return LONG_CONTEXT if input_tokens > LONG_CONTEXT_INPUT_TOKENS else INTERACTIVE


def meets_slo(
    slo: SloClass,
    ttft_s: float,
    tpot_s: float | None,
    e2e_s: float,
    deadline_s: float | None,
) -> bool:
    """Whether a *completed* request met every threshold of its class (TPOT None = 1 token)."""
    if slo.deadline:
        return deadline_s is None or e2e_s <= deadline_s
    if slo.ttft_s is not None and ttft_s > slo.ttft_s:
        return False
    return not (slo.tpot_s is not None and tpot_s is not None and tpot_s > slo.tpot_s)
