"""Where the simulator records outcomes for an admission stage that closes its loop on them.

An ``OutcomeSink`` gets every attempt that ended on an instance and every reject; it is also the
``GoodputSource`` the stage reads (in memory: ``agents.policy.slomax.feedback.InMemoryGoodput``;
through ClickHouse: ``infra.clickhouse.goodput.ClickHouseOutcomes``), so the simulated control loop
reads exactly what the production one reads.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agents.policy.pipeline import Scheduler
from agents.policy.slomax.feedback import GoodputSource


class OutcomeSink(GoodputSource, Protocol):
    def completed(
        self, time_s: float, slo_class: str, status: str, met: bool, output_tokens: int, attempt: int
    ) -> None: ...

    def rejected(self, time_s: float, slo_class: str) -> None: ...


@runtime_checkable
class _ClosesLoop(Protocol):
    def bind_feedback(self, source: GoodputSource) -> None: ...


def bind_feedback(scheduler: Scheduler, sink: OutcomeSink) -> OutcomeSink | None:
    """Bind ``sink`` to the scheduler's admission stage if it reads feedback; the sink to record
    into, or None (nothing reads it: record nothing)."""
    if isinstance(scheduler.admission, _ClosesLoop):
        scheduler.admission.bind_feedback(sink)
        return sink
    return None
