"""Where the simulator records outcomes for an admission stage that closes its loop on them.

An ``OutcomeSink`` gets every attempt that ended on an instance (``EndedAttempt``: what a
``Completion`` event carries) and every reject, and is the ``GoodputSource`` the stage reads:
``MemoryOutcomes`` here, or ``infra.clickhouse.goodput.ClickHouseOutcomes`` (the simulator writes
completions and rejects into ClickHouse and the control loop reads them back with the production
query; it takes any ended attempt that gives its ``Completion``, so the store adapter needs
nothing of the simulator). Both judge ``met`` by the same rule (``met_slo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, get_args

from agents.policy.slomax.feedback import ClassWindow, GoodputSource, InMemoryGoodput
from schemas.events import Completion
from sim.engine.attempt import Attempt
from sim.loop.deciders import PoolDecider
from sim.loop.lifecycle import Measures, deadline_at

_STATUSES = get_args(Completion.model_fields["status"].annotation)


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    """One attempt's end, as its ``Completion`` event would report it (times on the sim clock)."""

    time_s: float
    request_id: str
    attempt: int
    tenant: str
    model: str
    instance_id: str
    slo_class: str
    status: str  # ok | timeout | aborted | error
    arrival_s: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    deadline_s: float | None  # absolute
    met: bool

    @classmethod
    def of(cls, attempt: Attempt, measures: Measures, model: str, met: bool, now: float) -> EndedAttempt:
        """The end at ``now`` of ``attempt``, which ran on an instance (``model``: the one it
        asked for, or the fleet's default); ``met``: within its objective (``met_objective``)."""
        assert attempt.instance is not None and measures.e2e_s is not None
        request = attempt.request
        return cls(
            now, request.request_id, attempt.attempt, request.tenant, model,
            attempt.instance.spec.instance_id, request.slo_class, measures.status, attempt.arrival_s,
            measures.ttft_s, measures.tpot_s, measures.e2e_s if measures.status == "ok" else None,
            request.input_tokens, attempt.cached_tokens, attempt.generated, deadline_at(request), met,
        )  # fmt: skip

    def completion(self) -> Completion:
        """The ``Completion`` event of this end (a status the wire does not know is ``error``)."""
        return Completion.model_validate(
            {
                "ts": self.time_s, "request_id": self.request_id, "attempt": self.attempt,
                "instance_id": self.instance_id, "model": self.model, "tenant": self.tenant,
                "slo_class": self.slo_class, "status": self.status if self.status in _STATUSES else "error",
                "arrival_ts": self.arrival_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "input_tokens": self.input_tokens, "cached_tokens": self.cached_tokens,
                "output_tokens": self.output_tokens, "deadline_ts": self.deadline_s,
            }
        )  # fmt: skip


class OutcomeSink(GoodputSource, Protocol):
    def ended(self, attempt: EndedAttempt) -> None: ...

    def rejected(self, time_s: float, slo_class: str) -> None: ...


class MemoryOutcomes:
    """``OutcomeSink`` in memory."""

    def __init__(self) -> None:
        self.goodput = InMemoryGoodput()

    def ended(self, attempt: EndedAttempt) -> None:
        a = attempt
        self.goodput.completed(a.time_s, a.slo_class, a.status, a.met, a.output_tokens, a.attempt)

    def rejected(self, time_s: float, slo_class: str) -> None:
        self.goodput.rejected(time_s, slo_class)

    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]:
        return self.goodput.window(now_s, span_s)


def bind_feedback(scheduler: PoolDecider, sink: OutcomeSink) -> OutcomeSink | None:
    """Bind ``sink`` to the scheduler's admission stage (every decider's, with several) if it
    reads feedback (``Scheduler.bind_feedback``); the sink to record into, or None (nothing
    reads it: record nothing)."""
    return sink if scheduler.bind_feedback(sink) else None
