"""The feedback sink: writes events into ClickHouse, each ``event_id`` at most once.

Why not rely on ReplacingMergeTree alone: it deduplicates only when parts merge (or at read
time with FINAL), but the ``goodput_per_minute`` materialized view runs on every inserted
block, before any deduplication, and would count a redelivered completion twice. So the sink
drops repeats within a batch and skips event_ids already stored (one primary-key lookup per
batch, since every event table is ordered by event_id). The lookup runs inside the retry loop:
an insert that failed ambiguously (stored, but the answer was lost) is not written again.
Two sinks writing the *same* event at the same instant could both miss it; in the design one
worker owns each partition's rows (the store's consumer group, ``topic_sink.py``), so that
happens only around a rebalance, for rows the old owner had not made durable within
``feedback_commit_grace_s`` and still writes while the new owner reads them again (the table
collapses them; the roll-up could count such a row twice).

Retries (tenacity) live only here, at the I/O edge: exponential backoff with jitter, bounded
by ``retry_for_s``; after that the error propagates and the caller decides (the stream
redelivers, and the lookup keeps the redelivery harmless).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    DataError,
    IntegrityError,
    NotSupportedError,
    ProgrammingError,
)
from tenacity import Retrying, before_sleep_log, retry_if_exception, stop_after_delay, wait_random_exponential

from agents.policy.common.slo import SloClass, meets_slo
from schemas.events import (
    AdmissionDecision,
    Completion,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    ReplicaPlan,
    RoutingDecision,
)

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
Row = list[object]

DEFAULT_RETRY_FOR_S = 30.0

REQUEST_COLUMNS = (
    "event_id", "ts", "schema_version", "request_id", "attempt", "tenant", "model", "task_type",
    "slo_class", "input_tokens", "output_budget", "prompt_blocks", "deadline_ts", "allowed_regions",
    "home_dc", "prompt_block_hashes", "model_version", "session_id",
)  # fmt: skip
"""A request's row: counts, class, budget, placement constraints, its prompt's block-hash chain
(``prompt_block_hashes``) and its session (an opaque hash), never the prompt itself (``prompt``,
``messages``, ``prompt_token_ids`` are not stored)."""
ADMISSION_COLUMNS = (
    "event_id", "ts", "schema_version", "request_id", "attempt", "tenant", "model", "slo_class",
    "action", "reason", "policy", "queue_pool", "predicted_ttft_s", "retry_after_s",
)  # fmt: skip
ROUTING_COLUMNS = (
    "event_id", "ts", "schema_version", "request_id", "attempt", "tenant", "model", "slo_class", "dc",
    "instance_id", "policy", "reason", "predicted_ttft_s", "decision_latency_s", "input_tokens",
    "output_budget", "prompt_block_hashes", "prefill_instance_id",
)  # fmt: skip
"""``input_tokens``, ``output_budget`` and ``prompt_block_hashes`` are those of the request as the
decider routed it: counted and hashed by the worker when its client sent only the prompt's text;
``prefill_instance_id`` the instance that prefilled it first ("": it ran whole)."""
COMPLETION_COLUMNS = (
    "event_id", "ts", "schema_version", "request_id", "attempt", "instance_id", "model", "tenant",
    "slo_class", "status", "arrival_ts", "ttft_s", "tpot_s", "e2e_s", "input_tokens", "cached_tokens",
    "output_tokens", "deadline_ts", "met_slo",
)  # fmt: skip

FLEET_EVENT_COLUMNS = (
    "event_id", "ts", "schema_version", "kind", "dc", "model", "model_version", "tenant", "delta",
    "detail", "worker",
)  # fmt: skip

HEARTBEAT_COLUMNS = (
    "event_id", "ts", "schema_version", "instance_id", "dc", "model", "profile", "endpoint_ready",
    "waiting", "running", "kv_blocks_used", "kv_blocks_total", "gpus", "price_per_hour", "interval_s",
    "draining", "model_version", "kv_block_tokens", "max_seqs", "prefill_budget_tokens",
)  # fmt: skip

PLAN_COLUMNS = (
    "event_id", "ts", "schema_version", "planner", "model", "model_version", "dc", "replicas", "warm",
    "warm_given", "reason", "worker", "prefill_replicas",
)  # fmt: skip

RUN_COLUMNS = ("run_id", "run_policy")
"""Appended to every event table's row: the run and policy of the worker that stored it."""

PERMANENT_ERRORS = (ProgrammingError, DataError, IntegrityError, NotSupportedError)
"""The rows' or the query's fault: retrying cannot help."""


def is_transient(error: BaseException) -> bool:
    """Worth retrying: the store is down or slow (connection, server, timeout), not a malformed
    query or row. The one classification of the project (the sink's retries, the spool)."""
    return isinstance(error, DatabaseError | OSError) and not isinstance(error, PERMANENT_ERRORS)


def _retrying(retry_for_s: float) -> Retrying:
    return Retrying(
        stop=stop_after_delay(retry_for_s),
        wait=wait_random_exponential(multiplier=0.05, max=2.0),
        retry=retry_if_exception(is_transient),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_time(ts: float | None) -> datetime | None:
    """``ts`` truncated to the millisecond a DateTime64(3) column keeps, exactly: through
    ``datetime.fromtimestamp`` a float is first rounded to microseconds, so 1.9999995 s was
    stored as 2.000 s rather than 1.999 s."""
    if ts is None:
        return None
    try:
        return _EPOCH + timedelta(milliseconds=int(ts * 1000))
    except OverflowError as exc:  # a malformed row, as datetime.fromtimestamp reports it
        raise ValueError(f"timestamp {ts!r} is out of range") from exc


def met_slo(completion: Completion, slo: SloClass | None) -> bool:
    """Whether the attempt counts towards goodput: status ok and every threshold of its class met.

    An unknown class or a missing measurement (no TTFT or E2E) cannot be shown good: False.
    A deadline class is met when ``arrival_ts + e2e_s <= deadline_ts`` (no deadline: met).
    """
    if completion.status != "ok" or slo is None or completion.ttft_s is None or completion.e2e_s is None:
        return False
    deadline_s = None if completion.deadline_ts is None else completion.deadline_ts - completion.arrival_ts
    return meets_slo(slo, completion.ttft_s, completion.tpot_s, completion.e2e_s, deadline_s)


def sync_slo_classes(
    client: Client, classes: Mapping[str, SloClass], retry_for_s: float = DEFAULT_RETRY_FOR_S
) -> None:
    """Record the thresholds in force in ``slo_classes`` (the newest row per name wins)."""
    now = datetime.now(UTC)
    rows = [[c.name, c.ttft_s, c.tpot_s, int(c.deadline), now] for c in classes.values()]
    if rows:
        _retrying(retry_for_s)(
            client.insert,
            "slo_classes",
            rows,
            column_names=["name", "ttft_s", "tpot_s", "deadline", "updated_at"],
        )


class FeedbackSink:
    """Writes batches of events to their tables; each ``write_*`` returns the rows it inserted
    (the caller counts them in ``feedback_rows_total``).

    Constructing it records ``slo_classes`` (the thresholds ``met_slo`` is judged by). Not
    thread-safe: one sink per client, used from one thread (the feedback agent).
    """

    def __init__(
        self,
        client: Client,
        slo_classes: Mapping[str, SloClass],
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        run_id: str = "",
        run_policy: str = "",
        heartbeat_interval_s: float = 0.25,
    ) -> None:
        """Every row written carries ``run_id`` and ``run_policy`` (the run and policy of the
        worker that stores it), so one run can be read apart in a shared store. Each heartbeat
        stands for ``heartbeat_interval_s`` of its instance's time (the interval in force)."""
        self._client = client
        self._interval_s = heartbeat_interval_s
        self._slo = dict(slo_classes)
        self._retry_for_s = retry_for_s
        self._run = [run_id, run_policy]
        sync_slo_classes(client, self._slo, retry_for_s)

    def write_requests(self, events: Sequence[InferenceRequest]) -> int:
        return self._write("requests", REQUEST_COLUMNS, events, _request_row)

    def write_admission(self, events: Sequence[AdmissionDecision]) -> int:
        return self._write("admission_decisions", ADMISSION_COLUMNS, events, _admission_row)

    def write_routing(self, events: Sequence[RoutingDecision]) -> int:
        return self._write("routing_decisions", ROUTING_COLUMNS, events, _routing_row)

    def write_completions(self, events: Sequence[Completion]) -> int:
        return self._write("completions", COMPLETION_COLUMNS, events, self._completion_row)

    def write_fleet_events(self, events: Sequence[FleetEvent]) -> int:
        return self._write("fleet_events", FLEET_EVENT_COLUMNS, events, _fleet_event_row)

    def write_heartbeats(self, events: Sequence[Heartbeat]) -> int:
        return self._write("heartbeats", HEARTBEAT_COLUMNS, events, self._heartbeat_row)

    def write_plans(self, events: Sequence[ReplicaPlan]) -> int:
        return self._write("replica_plans", PLAN_COLUMNS, events, _plan_row)

    def _heartbeat_row(self, h: Heartbeat) -> Row:
        return [
            h.event_id, ms_time(h.ts), h.schema_version, h.instance_id, h.dc, h.model, h.profile,
            int(h.endpoint_ready), h.waiting, h.running, h.kv_blocks_used, h.kv_blocks_total, h.gpus,
            h.price_per_hour, self._interval_s, int(h.draining), h.model_version, h.kv_block_tokens,
            h.max_seqs, h.prefill_budget_tokens,
        ]  # fmt: skip

    def _completion_row(self, c: Completion) -> Row:
        good = met_slo(c, self._slo.get(c.slo_class))
        return [
            c.event_id, ms_time(c.ts), c.schema_version, c.request_id, c.attempt, c.instance_id, c.model,
            c.tenant, c.slo_class, c.status, ms_time(c.arrival_ts), c.ttft_s, c.tpot_s, c.e2e_s,
            c.input_tokens, c.cached_tokens, c.output_tokens, ms_time(c.deadline_ts), int(good),
        ]  # fmt: skip

    def _write(
        self, table: str, columns: Sequence[str], events: Sequence[E], to_row: Callable[[E], Row]
    ) -> int:
        rows: dict[str, Row] = {}
        for event in events:
            if event.event_id not in rows:  # the first copy of a repeated event wins
                rows[event.event_id] = to_row(event) + self._run
        if not rows:
            return 0
        return _retrying(self._retry_for_s)(self._insert_new, table, [*columns, *RUN_COLUMNS], rows)

    def _insert_new(self, table: str, columns: Sequence[str], rows: Mapping[str, Row]) -> int:
        stored = self._client.query(
            f"SELECT DISTINCT event_id FROM {table} WHERE event_id IN {{ids:Array(String)}}",
            parameters={"ids": list(rows)},
        ).result_rows
        known = {row[0] for row in stored}
        fresh = [row for event_id, row in rows.items() if event_id not in known]
        if fresh:
            # Rows of one batch may span many months (partitions): ClickHouse refuses more than
            # 100 per insert by default, which valid timestamps (1970..2100) can exceed.
            self._client.insert(
                table, fresh, column_names=list(columns), settings={"max_partitions_per_insert_block": 0}
            )
        return len(fresh)


def _request_row(r: InferenceRequest) -> Row:
    return [
        r.event_id, ms_time(r.ts), r.schema_version, r.request_id, r.attempt, r.tenant, r.model, r.task_type,
        r.slo_class or "", r.input_tokens, r.output_budget, len(r.prompt_block_hashes),
        ms_time(r.deadline_ts), list(r.allowed_regions), r.home_dc, list(r.prompt_block_hashes),
        r.model_version, r.session_id,
    ]  # fmt: skip


def _admission_row(a: AdmissionDecision) -> Row:
    return [
        a.event_id, ms_time(a.ts), a.schema_version, a.request_id, a.attempt, a.tenant, a.model, a.slo_class,
        a.action, a.reason, a.policy, a.queue_pool, a.predicted_ttft_s, a.retry_after_s,
    ]  # fmt: skip


def _routing_row(d: RoutingDecision) -> Row:
    return [
        d.event_id, ms_time(d.ts), d.schema_version, d.request_id, d.attempt, d.tenant, d.model, d.slo_class,
        d.dc, d.instance_id, d.policy, d.reason, d.predicted_ttft_s, d.decision_latency_s,
        d.request.input_tokens, d.request.output_budget, list(d.request.prompt_block_hashes),
        d.prefill_instance_id,
    ]  # fmt: skip


def _fleet_event_row(f: FleetEvent) -> Row:
    return [
        f.event_id, ms_time(f.ts), f.schema_version, f.kind, f.dc, f.model, f.model_version, f.tenant,
        f.delta, f.detail, f.worker,
    ]  # fmt: skip


def _plan_row(p: ReplicaPlan) -> Row:
    return [
        p.event_id, ms_time(p.ts), p.schema_version, p.planner, p.model, p.model_version, p.dc, p.replicas,
        list(p.warm or ()), int(p.warm is not None), p.reason, p.worker, p.prefill_replicas,
    ]  # fmt: skip
