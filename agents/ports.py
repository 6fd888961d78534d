"""What the streaming agents need from the outside, as small interfaces the bootstrap fills in.

The worker bootstrap (``infra.entrypoints.worker``) provides a ClickHouse-backed ``FeedbackStore`` and a
Prometheus-backed ``Telemetry``; tests inject fakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agents.routing import Routed
from schemas.events import AdmissionDecision, Completion, InferenceRequest, RoutingDecision


class FeedbackStore(Protocol):
    """Where decisions and outcomes go for analysis and the control loop (idempotent by event id)."""

    async def requests(self, events: Sequence[InferenceRequest]) -> None: ...

    async def admissions(self, events: Sequence[AdmissionDecision]) -> None: ...

    async def routings(self, events: Sequence[RoutingDecision]) -> None: ...

    async def completions(self, events: Sequence[Completion]) -> None: ...


class Telemetry(Protocol):
    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        """``outcomes`` of one batch, decided and handed to the producer ``latency_s`` seconds
        after the batch reached the worker."""

    def dead_lettered(self, topic: str) -> None: ...

    def queue_depth(self, pool: str, depth: int) -> None: ...


class NoTelemetry:
    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        pass

    def dead_lettered(self, topic: str) -> None:
        pass

    def queue_depth(self, pool: str, depth: int) -> None:
        pass
