"""One batch of feedback rows into ClickHouse, isolating the rows it refuses for good.

``store_rows(sink, table, rows)`` writes ``rows`` with the sink's retry budget. A transient error
(connection, server, timeout) raises ``StoreDown``: the caller keeps the rows. A permanent one
(``DataError``, ``ProgrammingError``, or any error converting them) splits the batch in halves
until the refused rows are isolated, at most ``MAX_SPLIT_WRITES`` extra writes (past that the
remainder is refused whole); the refused parts are returned with their error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infra import metrics
from infra.clickhouse.sink import FeedbackSink, is_transient
from infra.clickhouse.spool import TABLES
from infra.errors import first_line
from schemas.events import Event

MAX_SPLIT_WRITES = 64
"""At most this many extra writes to isolate the refused rows of one batch."""

WRITERS: dict[str, Callable[[FeedbackSink, Sequence[Any]], int]] = {
    "requests": FeedbackSink.write_requests,
    "admission_decisions": FeedbackSink.write_admission,
    "routing_decisions": FeedbackSink.write_routing,
    "completions": FeedbackSink.write_completions,
    "fleet_events": FeedbackSink.write_fleet_events,
    "heartbeats": FeedbackSink.write_heartbeats,
    "replica_plans": FeedbackSink.write_plans,
}
assert set(WRITERS) == set(TABLES)


class StoreDown(Exception):
    """A write failed after the sink's retry budget with a transient error."""


def store_rows(
    sink: FeedbackSink, table: str, rows: list[Event], on_written: Callable[[], None] = lambda: None
) -> list[tuple[list[Event], str]]:
    """Write ``rows`` into ``table``; returns the parts ClickHouse refused for good, with the
    error. ``on_written`` after every write that went through. Raises ``StoreDown`` on a
    transient error (nothing refused is reported then)."""
    write = WRITERS[table]
    refused: list[tuple[list[Event], str]] = []
    budget = MAX_SPLIT_WRITES

    def attempt(part: list[Event]) -> None:
        nonlocal budget
        try:
            written = write(sink, part)
        except Exception as exc:
            if is_transient(exc):
                raise StoreDown(first_line(exc)[:300]) from exc
            if len(part) == 1 or budget < 2:
                refused.append((part, f"{type(exc).__name__}: {exc}"))
                return
            budget -= 2
            middle = len(part) // 2
            attempt(part[:middle])
            attempt(part[middle:])
            return
        metrics.feedback_rows_total.labels(table=table).inc(written)
        on_written()

    attempt(rows)
    return refused
