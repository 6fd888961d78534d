"""The worker's feedback store: rows are taken at once, ClickHouse gets them later.

``write(table, events)`` only *enqueues*: it puts the events in a bounded memory buffer and
returns a receipt (no I/O, no waiting on ClickHouse), a future that completes once every one of
those rows is *durable*: written to ClickHouse, quarantined (refused for good, see below), or
fsync'd to the spool. It fails with ``RowsLost`` if any of them was dropped (buffer or spool
full, the disk failed, the store closed). The topic sink (``infra/clickhouse/topic_sink.py``)
commits a message's offset only after its row's receipt completed, so rows in memory are never
the only copy. Two threads do the rest:

- the **store thread** owns the ClickHouse client and the sink (one thread, as the embedded
  engine and the sink want). It connects and migrates with bounded exponential back-off
  (``backoff_s``), retried until it works, so the worker starts without its store. Once up it
  writes, oldest first: the disk spool (``infra/clickhouse/spool.py``) before the buffer, the
  buffer in batches of ``batch_size`` rows per table or whatever waited ``flush_s``.
- the **spooler thread** moves buffered rows to the spool, fsync'd, while the store is not up
  (after ``flush_s`` or ``batch_size`` rows, so the disk sees batches), and whenever the store
  is up but slow: the buffer passed ``spill_at`` rows or its oldest row waited ``spill_after_s``.

What happens when:

- ClickHouse unreachable at start, or lost: the store is "down" (``tokenfleet_feedback_store_up``
  0), rows spool; the store thread retries (connect, or the oldest spooled batch) with back-off.
- A write fails after the sink's retry budget (``retry_for_s``, a transient error: connection,
  server, timeout): its rows go to the spool (nothing is dropped), the store is down, as above.
- ClickHouse refuses rows for good (``DataError``, ``ProgrammingError``, ... or any error
  converting them): the refused rows are isolated (``infra/clickhouse/writes.py``) and go to
  the spool's ``rejected-<table>.jsonl`` with the error, are logged and counted
  (``tokenfleet_feedback_rejected_rows_total``), and the queue goes on.
- The buffer is full (``buffer_rows``; only if the disk cannot keep up): the newest rows are
  dropped (their receipts fail), logged, counted
  (``tokenfleet_feedback_dropped_rows_total{reason="buffer_full"}``).
  The spool is full (``spool_max_bytes``): it keeps the older rows and drops the newest
  (``reason="spool_full"``); the disk fails: ``reason="spool_error"``.
- ``close()``: with the store up, flushes spool and buffer to ClickHouse for up to
  ``close_timeout_s``; whatever is left (store down, time up, a write still hanging) is spooled,
  and drained by the next worker that starts on the same spool directory.

Reads (``submit``) run on the store thread between writes (``infra/clickhouse/calls.py``).

Re-sent rows are harmless: the sink skips event_ids already stored (one lookup per batch), so a
spooled batch sent again after a crash, or a write that failed ambiguously and was spooled,
is stored once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import SloClass
from infra import metrics
from infra.clickhouse.calls import Call, CallQueue, Done
from infra.clickhouse.client import connect, split_database
from infra.clickhouse.migrate import migrate
from infra.clickhouse.sink import DEFAULT_RETRY_FOR_S, FeedbackSink
from infra.clickhouse.spool import DEFAULT_MAX_BYTES, TABLES, Spool
from infra.clickhouse.writes import StoreDown, store_rows
from infra.errors import first_line
from schemas.events import Event

if TYPE_CHECKING:
    from infra.settings import Settings

log = logging.getLogger(__name__)

REPEAT_LOG_S = 60.0


class RowsLost(Exception):
    """Some rows of a ``write`` were dropped (buffer or spool full, the disk failed, the store
    closed): they are in neither ClickHouse nor the spool."""


class _Receipt:
    """The durability of one ``write``: ``future`` completes when none of its rows is pending
    (with ``RowsLost`` if any was dropped). Settled from any of the store's threads."""

    def __init__(self, rows: int) -> None:
        self.future: Future[None] = Future()
        self._pending = rows
        self._lost = 0
        self._lock = threading.Lock()
        if rows == 0:
            self.future.set_result(None)

    def settle(self, rows: int, lost: bool) -> None:
        with self._lock:
            self._pending -= rows
            if lost:
                self._lost += rows
            if self._pending > 0 or self.future.done():
                return
            if self._lost:
                self.future.set_exception(RowsLost(f"{self._lost} rows dropped before they were durable"))
            else:
                self.future.set_result(None)


Row = tuple[Event, _Receipt]
"""A buffered event and the receipt of the write it came with."""
Work = list[tuple[str, list[Row]]]


def _settle(rows: Sequence[Row], lost: bool = False) -> None:
    """Mark ``rows`` durable (or ``lost``) on their receipts."""
    counts: dict[int, tuple[_Receipt, int]] = {}
    for _event, receipt in rows:
        held = counts.get(id(receipt))
        counts[id(receipt)] = (receipt, 1 if held is None else held[1] + 1)
    for receipt, n in counts.values():
        receipt.settle(n, lost)


def _events(rows: Sequence[Row]) -> list[Event]:
    return [event for event, _receipt in rows]


class _Throttled:
    """Logs a condition when it starts and then at most every ``REPEAT_LOG_S`` while it lasts."""

    def __init__(self) -> None:
        self.at: float | None = None

    def due(self) -> bool:
        now = time.monotonic()
        if self.at is None or now - self.at >= REPEAT_LOG_S:
            self.at = now
            return True
        return False

    def reset(self) -> None:
        self.at = None


class ClickHouseFeedback:
    """The feedback tables on ClickHouse, off the request path (see the module docstring)."""

    def __init__(
        self,
        url: str,
        slo_classes: Mapping[str, SloClass],
        *,
        spool_dir: Path,
        batch_size: int = 500,
        flush_s: float = 1.0,
        buffer_rows: int = 50_000,
        spool_max_bytes: int = DEFAULT_MAX_BYTES,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        close_timeout_s: float = 10.0,
        backoff_s: tuple[float, float] = (0.5, 10.0),
        run_id: str = "",
        run_policy: str = "",
        heartbeat_interval_s: float = 0.25,
    ) -> None:
        """``run_id`` / ``run_policy`` are stamped on every row written; each heartbeat stands
        for ``heartbeat_interval_s`` of its instance's time (``FeedbackSink``)."""
        split_database(url)  # a malformed URL is a configuration error: fail now, not in a loop
        self._url = url
        self.run_id, self.run_policy = run_id, run_policy
        self._heartbeat_interval_s = heartbeat_interval_s
        self._slo = dict(slo_classes)
        self._batch_size = batch_size
        self._flush_s = flush_s
        self._buffer_rows = buffer_rows
        self._spill_at = min(buffer_rows, max(2 * batch_size, buffer_rows // 2))
        self._spill_after_s = max(5 * flush_s, 5.0)
        self._retry_for_s = retry_for_s
        self._close_timeout_s = close_timeout_s
        self._backoff_min, self._backoff_max = backoff_s
        self.applied: list[str] = []  # migrations the store thread applied when it connected
        self.spool = Spool(spool_dir, spool_max_bytes, on_rejected=_count_rejected)

        self._cond = threading.Condition()  # guards everything below
        self._buffer: dict[str, list[Row]] = {table: [] for table in TABLES}
        self._count = 0
        self._since: float | None = None  # when the oldest buffered row arrived (monotonic)
        self._inflight: Work = []  # taken from the buffer by the store thread, not yet stored
        self._up = False
        self._closing = False
        self._deadline = float("inf")
        self._abandoned = False  # close() has spooled what was left; the threads just exit
        self._closed = False
        self._flush_now = False
        self._down_log = _Throttled()
        self._drop_log = _Throttled()
        self._calls = CallQueue(self._cond)

        metrics.feedback_store_up.set(0)
        metrics.feedback_buffer_rows.set(0)
        metrics.feedback_spooled_rows.set(self.spool.rows)
        self._store_thread = threading.Thread(target=self._run_store, name="clickhouse-store", daemon=True)
        self._spooler = threading.Thread(target=self._run_spooler, name="clickhouse-spooler", daemon=True)
        self._store_thread.start()
        self._spooler.start()

    @classmethod
    def from_settings(cls, settings: Settings, run_id: str = "") -> ClickHouseFeedback:
        return cls(
            settings.clickhouse_url,
            settings.slo(),
            spool_dir=settings.feedback_spool_path,
            batch_size=settings.feedback_batch_size,
            flush_s=settings.feedback_flush_s,
            buffer_rows=settings.feedback_buffer_rows,
            spool_max_bytes=settings.feedback_spool_max_bytes,
            retry_for_s=settings.feedback_retry_s,
            close_timeout_s=settings.feedback_close_s,
            run_id=run_id or settings.run_id,
            run_policy=settings.policy,
            heartbeat_interval_s=settings.heartbeat_interval_s,
        )

    # -- writing: enqueue only ----------------------------------------------------------------

    def write(self, table: str, events: Sequence[Event]) -> Future[None]:
        """Enqueue ``events`` for ``table`` (a name of ``spool.TABLES``); never blocks. The
        result completes once they are all durable (ClickHouse, quarantine or spool), or fails
        with ``RowsLost`` if any was dropped (see the module docstring)."""
        if table not in TABLES:
            raise ValueError(f"unknown feedback table {table!r}")
        receipt = _Receipt(len(events))
        if not events:
            return receipt.future
        rows = [(event, receipt) for event in events]
        with self._cond:
            if self._closed:
                self._dropped(table, rows, "closed")
                return receipt.future
            before = self._count
            room = self._buffer_rows - before
            if room < len(rows):
                self._dropped(table, rows[max(room, 0) :], "buffer_full")
                rows = rows[: max(room, 0)]
            self._buffer[table].extend(rows)
            self._count += len(rows)
            if before == 0 and rows:
                self._since = time.monotonic()
            after = self._count
            if before == 0 or before < self._batch_size <= after or before < self._spill_at <= after:
                self._cond.notify_all()
        metrics.feedback_buffer_rows.set(after)
        return receipt.future

    def _dropped(self, table: str, rows: Sequence[Row], reason: str) -> None:
        """``rows`` are lost: fail their receipts, count and log them."""
        _settle(rows, lost=True)
        self._count_dropped(table, len(rows), reason)

    def _count_dropped(self, table: str, rows: int, reason: str) -> None:
        if rows <= 0:
            return
        metrics.feedback_dropped_rows_total.labels(table=table, reason=reason).inc(rows)
        if self._drop_log.due():
            log.error(
                "feedback: %d %s rows dropped (%s); see tokenfleet_feedback_dropped_rows_total",
                rows,
                table,
                reason,
            )

    def submit(self, call: Call, done: Done) -> bool:
        """Run ``call(client)`` on the store thread (the one that owns the client), between
        writes; ``done(result, error)`` is called there with its outcome. Never blocks: False
        (nothing queued) while the store is down, closing, or ``MAX_CALLS`` calls wait. For
        the few reads the service makes (SLOMax's control loop), not for bulk work."""
        with self._cond:
            if not self._up or self._closing or not self._calls.put(call, done):
                return False
            self._cond.notify_all()
        return True

    # -- state, for tests and operators -------------------------------------------------------

    @property
    def store_up(self) -> bool:
        return self._up

    @property
    def buffered_rows(self) -> int:
        return self._count

    @property
    def spooled_rows(self) -> int:
        return self.spool.rows

    def flush(self, timeout_s: float) -> bool:
        """Wait until every row so far is in ClickHouse (buffer, spool and in-flight writes
        empty); False if that did not happen within ``timeout_s``. Blocks: not for the loop."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flush_now = True  # the store thread takes what is buffered without waiting flush_s
            self._cond.notify_all()
        while True:
            with self._cond:
                if self._up and self._count == 0 and not self._inflight and self.spool.rows == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    # -- the store thread ---------------------------------------------------------------------

    def _run_store(self) -> None:
        client: Client | None = None
        sink: FeedbackSink | None = None
        backoff = self._backoff_min
        try:
            while not self._abandoned:
                if sink is None:
                    if self._closing:
                        return
                    try:
                        client, sink = self._connect()
                    except Exception as exc:
                        if self._down_log.due():
                            log.warning(
                                "feedback store %s unavailable (%s); rows spool to %s, retrying",
                                self._url,
                                first_line(exc)[:300],
                                self.spool.directory,
                            )
                        self._wait(backoff)
                        backoff = min(2 * backoff, self._backoff_max)
                        continue
                    self._set_up(True)
                    backoff = self._backoff_min
                if self._closing and (not self._up or time.monotonic() >= self._deadline):
                    return  # closing: no more attempts on a store that is down, nor past the deadline
                try:
                    assert client is not None
                    self._calls.run(client)
                    if not (self._drain_spool(sink) or self._flush_buffer(sink)):
                        return  # closing, and everything is stored
                    if self._up:
                        backoff = self._backoff_min
                except StoreDown as down:
                    self._set_up(False)
                    if self._down_log.due():
                        log.warning(
                            "feedback store %s down (%s); rows spool to %s, retrying",
                            self._url,
                            down,
                            self.spool.directory,
                        )
                    if self._closing:
                        return
                    self._wait(backoff)
                    backoff = min(2 * backoff, self._backoff_max)
                except Exception:
                    if self._abandoned:
                        return
                    log.exception("feedback store thread: unexpected error; retrying")
                    self._wait(backoff)
                    backoff = min(2 * backoff, self._backoff_max)
        finally:
            self._set_up(False)
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()

    def _connect(self) -> tuple[Client, FeedbackSink]:
        client = connect(self._url)
        try:
            applied = migrate(client)
            sink = FeedbackSink(
                client,
                self._slo,
                retry_for_s=self._retry_for_s,
                run_id=self.run_id,
                run_policy=self.run_policy,
                heartbeat_interval_s=self._heartbeat_interval_s,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                client.close()
            raise
        self.applied = applied
        log.info(
            "feedback store %s up (migrations applied: %s); %d spooled rows to drain",
            self._url,
            ", ".join(applied) or "none",
            self.spool.rows,
        )
        return client, sink

    def _set_up(self, up: bool) -> None:
        with self._cond:
            if self._up != up:
                self._up = up
                self._cond.notify_all()
                if up:
                    self._down_log.reset()
        metrics.feedback_store_up.set(int(up))

    def _wait(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._closing, timeout=seconds)

    def _drain_spool(self, sink: FeedbackSink) -> bool:
        """Store the oldest spooled batch; False if the spool is empty."""
        batch = self.spool.next_batch(self._batch_size)
        if batch is None:
            return False
        refused = self._store(sink, batch.table, list(batch.events))
        for rows, error in refused:
            self._quarantine(batch.table, rows, error)
        with self._cond:  # flush() sees the spool and its gauge change together
            self.spool.done(batch)
            metrics.feedback_spooled_rows.set(self.spool.rows)
        return True

    def _flush_buffer(self, sink: FeedbackSink) -> bool:
        """Wait for a batch's worth of buffered rows (or ``flush_s``) and store them; True to
        go round again (rows stored, or rows reached the spool), False when closing and empty."""
        with self._cond:
            while True:
                if self.spool.rows > 0 or self._calls:
                    return True
                now = time.monotonic()
                due = self._flush_now or (self._since is not None and now - self._since >= self._flush_s)
                if self._count and (self._closing or self._count >= self._batch_size or due):
                    break
                if self._closing:
                    return False
                timeout = None if self._since is None else self._since + self._flush_s - now
                self._cond.wait(timeout)
            work = self._take(self._batch_size)
            self._inflight = list(work)
        for index, (table, rows) in enumerate(work):
            try:
                refused = self._store(sink, table, _events(rows))
            except BaseException:
                self._spool_work(work[index:], inflight=True)  # after the retry budget: kept
                raise
            for part, error in refused:
                self._quarantine(table, part, error)
            with self._cond:
                self._inflight = work[index + 1 :]
            _settle(rows)  # in ClickHouse, or quarantined on disk
        return True

    def _store(self, sink: FeedbackSink, table: str, rows: list[Event]) -> list[tuple[list[Event], str]]:
        """``store_rows``; a write that goes through marks the store up again."""
        return store_rows(sink, table, rows, self._written)

    def _written(self) -> None:
        if not self._up:
            self._set_up(True)  # a write went through: the store is back

    def _quarantine(self, table: str, rows: list[Event], error: str) -> None:
        log.error(
            "feedback: ClickHouse refused %d %s rows for good (%s); quarantined to %s",
            len(rows),
            table,
            error.splitlines()[0] if error else "",
            self.spool.rejected_path(table),
        )
        kept = self.spool.reject_events(table, rows, error)
        # Not a lost write: the row is bad, reading it again cannot help (receipts stay good).
        self._count_dropped(table, len(rows) - kept, "rejected_full")

    # -- the spooler thread -------------------------------------------------------------------

    def _run_spooler(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closing:
                        return
                    now = time.monotonic()
                    age = 0.0 if self._since is None else now - self._since
                    down = not self._up and (self._count >= self._batch_size or age >= self._flush_s)
                    slow = self._count >= self._spill_at or age >= self._spill_after_s
                    if self._count and (down or slow):
                        break
                    if self._since is None:
                        timeout = None
                    else:
                        wait_s = self._spill_after_s if self._up else self._flush_s
                        timeout = max(self._since + wait_s - now, 0.01)
                    self._cond.wait(timeout)
                work = self._take(None)
            try:
                self._spool_work(work)
            except Exception:
                log.exception("feedback spooler: unexpected error")
            with self._cond:
                self._cond.notify_all()  # the store thread drains the spool first

    def _take(self, limit: int | None) -> Work:
        """(Lock held.) Up to ``limit`` rows per table out of the buffer, oldest first."""
        work: Work = []
        for table, rows in self._buffer.items():
            if rows:
                taken = rows if limit is None else rows[:limit]
                self._buffer[table] = [] if limit is None else rows[limit:]
                work.append((table, taken))
                self._count -= len(taken)
        if self._count == 0:
            self._since = None
            self._flush_now = False
        metrics.feedback_buffer_rows.set(self._count)
        return work

    def _spool_work(self, work: Work, inflight: bool = False) -> None:
        for index, (table, rows) in enumerate(work):
            if self._abandoned:
                if not inflight:  # close() spooled the in-flight rows, not these
                    for other, left in work[index:]:
                        self._dropped(other, left, "closed")
                return
            try:
                written = self.spool.append(table, _events(rows))
            except OSError as exc:
                log.error("feedback spool %s: write failed: %s", self.spool.directory, exc)
                self._dropped(table, rows, "spool_error")
            else:
                _settle(rows[:written])  # fsync'd
                self._dropped(table, rows[written:], "spool_full")
        if inflight:
            with self._cond:
                self._inflight = []
        metrics.feedback_spooled_rows.set(self.spool.rows)

    # -- shutdown -----------------------------------------------------------------------------

    def close(self, timeout_s: float | None = None) -> None:
        """Flush to ClickHouse for up to ``timeout_s`` (default ``close_timeout_s``) if it is up;
        spool whatever is left. Returns within about that time plus a local disk write."""
        if self._closed:
            return
        timeout = self._close_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        with self._cond:
            self._closing = True
            self._deadline = started + timeout
            self._cond.notify_all()
        self._store_thread.join(timeout)
        self._spooler.join(max(self._deadline - time.monotonic(), 0.0) + 5.0)
        with self._cond:
            self._abandoned = True
            self._closed = True
            work = self._take(None) + self._inflight
            self._inflight = []
        left = sum(len(rows) for _table, rows in work)
        for table, rows in work:
            try:
                written = self.spool.append(table, _events(rows))
            except OSError as exc:
                log.error("feedback spool %s: write failed at close: %s", self.spool.directory, exc)
                self._dropped(table, rows, "spool_error")
            else:
                _settle(rows[:written])
                self._dropped(table, rows[written:], "spool_full")
        spooled = self.spool.rows
        self.spool.close()
        metrics.feedback_spooled_rows.set(spooled)
        metrics.feedback_buffer_rows.set(0)
        metrics.feedback_store_up.set(0)
        elapsed = time.monotonic() - started
        if spooled:
            log.warning(
                "feedback store closed in %.1f s: %d rows (%d from memory) wait in the spool %s "
                "for the next start",
                elapsed,
                spooled,
                left,
                self.spool.directory,
            )
        else:
            log.info("feedback store closed in %.1f s; everything stored", elapsed)


def _count_rejected(table: str, rows: int) -> None:
    metrics.feedback_rejected_rows_total.labels(table=table).inc(rows)
