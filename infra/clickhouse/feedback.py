"""The worker's ``FeedbackStore``: ClickHouse inserts on one dedicated thread.

Inserts block (HTTP round-trip, or the in-process engine), so they run off the event loop, on a
single thread because the embedded engine and the sink are used from one thread at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from agents.policy.common.slo import SloClass
from infra import metrics
from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from infra.clickhouse.sink import FeedbackSink
from schemas.events import AdmissionDecision, Completion, InferenceRequest, RoutingDecision

T = TypeVar("T")


class ClickHouseFeedback:
    def __init__(self, url: str, slo_classes: dict[str, SloClass]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self._client = self._executor.submit(connect, url).result()
        self.applied = self._executor.submit(migrate, self._client).result()
        self._sink = self._executor.submit(FeedbackSink, self._client, slo_classes).result()

    async def _run(self, table: str, write: Callable[[Sequence[T]], int], events: Sequence[T]) -> None:
        if not events:
            return
        written = await asyncio.get_running_loop().run_in_executor(self._executor, write, events)
        metrics.feedback_rows_total.labels(table=table).inc(written)

    async def requests(self, events: Sequence[InferenceRequest]) -> None:
        await self._run("requests", self._sink.write_requests, events)

    async def admissions(self, events: Sequence[AdmissionDecision]) -> None:
        await self._run("admission_decisions", self._sink.write_admission, events)

    async def routings(self, events: Sequence[RoutingDecision]) -> None:
        await self._run("routing_decisions", self._sink.write_routing, events)

    async def completions(self, events: Sequence[Completion]) -> None:
        await self._run("completions", self._sink.write_completions, events)

    def close(self) -> None:
        self._executor.submit(self._client.close).result()
        self._executor.shutdown()
