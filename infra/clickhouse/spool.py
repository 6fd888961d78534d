"""The feedback spool: events waiting on local disk for the ClickHouse store, oldest first.

When the store is down or slow (or not connected yet), the feedback writer appends events here
instead of holding them in memory; when it is back, the writer drains the spool before new rows.

Format. A directory of *segments*, ``<seq>-<table>.jsonl``: one JSON line per event
(``schemas.codec.encode``, the same JSON as on the wire), one open segment per table at a time;
``seq`` is a process-independent, ever-growing number, so the file names sort oldest first. A
segment is closed ("sealed") when it reaches ``segment_bytes``, when the drain reaches it, and
at close; a restarted process never appends to an old segment (a half-written last line from a
crash stays the last line of its file). Every ``append`` call is written and fsync'd as one
batch (a new file's directory entry too): once ``append`` has returned, the rows survive a
crash of the process or the machine.

Drain. ``next_batch`` hands out up to ``max_rows`` events of the oldest segment (lowest
``seq``; within a table that is append order, across tables creation order of the segments);
``done`` marks them stored, and the segment file is deleted once all its rows are. Progress
inside a segment is kept in memory only: after a restart a segment is sent again from its
start. That is harmless: the sink (``infra/clickhouse/sink.py``) skips event_ids already
stored, so a re-sent row is never stored twice.

Quarantine. Rows the store refuses for good (a malformed row: ``DataError``,
``ProgrammingError``, ...) go to ``rejected-<table>.jsonl`` with the error, one JSON object a
line: ``{"table", "error", "rejected_at", "event"}`` (``"line"`` instead of ``"event"`` for a
spool line that did not decode, e.g. the torn last line of a crash). Rejected files are never
drained; an operator can fix and replay them. They are bounded by ``rejected_max_bytes``.

Bounds. Segments may hold ``max_bytes`` in all. An append that does not fit keeps what fits and
*drops the rest* (the newest rows): the data already spooled is older and is kept, and the
caller learns how many rows were dropped (the feedback store counts them in
``tokenfleet_feedback_dropped_rows_total``). The spool logs a warning when the bound is first
hit and again at most every ``FULL_LOG_EVERY_S`` while it stays hit.

A spool directory belongs to one process at a time (an exclusive ``flock`` on ``.lock``): a
second ``Spool`` on it raises ``SpoolLocked``. The methods are thread-safe (one lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from schemas.codec import DecodeError, decode, encode
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

TABLES: dict[str, type[Event]] = {
    "requests": InferenceRequest,
    "admission_decisions": AdmissionDecision,
    "routing_decisions": RoutingDecision,
    "completions": Completion,
    "fleet_events": FleetEvent,
    "heartbeats": Heartbeat,
    "replica_plans": ReplicaPlan,
}
"""The feedback tables, and the event kind each stores."""

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
FULL_LOG_EVERY_S = 60.0

_SEGMENT = re.compile(r"^(\d{12})-([a-z_]+)\.jsonl$")


class SpoolLocked(RuntimeError):
    """Another process (or another ``Spool`` of this one) owns the spool directory."""


@dataclass
class _Segment:
    seq: int
    table: str
    path: Path
    rows: int
    size: int
    handle: IO[bytes] | None = None  # open for appends; None once sealed


@dataclass
class _Cursor:
    """The segment being drained: its events, read once, and how many of them are stored."""

    segment: _Segment
    events: list[Event]
    stored: int = 0


@dataclass(frozen=True)
class SpoolBatch:
    """Events of one segment, handed out by ``next_batch``; give it back to ``done`` or ``reject``."""

    table: str
    events: tuple[Event, ...]
    seq: int
    start: int


@dataclass
class SpoolStats:
    rows: int = 0
    bytes: int = 0
    dropped_rows: int = 0
    rejected_rows: int = 0
    rejected_dropped_rows: int = 0
    dropped_by_table: dict[str, int] = field(default_factory=dict)


class Spool:
    """Events on disk, per table, drained oldest first (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        rejected_max_bytes: int | None = None,
        on_rejected: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_rejected(table, rows)`` is called for every quarantine (the feedback store counts
        them in a metric), also for undecodable lines found while draining."""
        self.directory = directory
        self._on_rejected = on_rejected
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.rejected_max_bytes = max_bytes if rejected_max_bytes is None else rejected_max_bytes
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = (directory / ".lock").open("a+b")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise SpoolLocked(f"the feedback spool {directory} is in use by another process") from None
        self._closed = False
        self._segments: dict[int, _Segment] = {}
        self._open: dict[str, _Segment] = {}
        self._cursor: _Cursor | None = None
        self._stats = SpoolStats()
        self._full_logged_at: float | None = None
        self._rejected_bytes = sum(p.stat().st_size for p in directory.glob("rejected-*.jsonl"))
        for path in directory.iterdir():
            match = _SEGMENT.match(path.name)
            if match is None or match.group(2) not in TABLES:
                continue
            data = path.read_bytes()
            rows = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
            if rows == 0:
                path.unlink()
                continue
            seq = int(match.group(1))
            self._segments[seq] = _Segment(seq, match.group(2), path, rows, len(data))
        self._next_seq = max(self._segments, default=-1) + 1
        self._stats.rows = sum(s.rows for s in self._segments.values())
        self._stats.bytes = sum(s.size for s in self._segments.values())
        if self._segments:
            log.warning(
                "feedback spool %s: %d rows in %d segments from an earlier run, to be drained",
                directory,
                self._stats.rows,
                len(self._segments),
            )

    # -- state ----------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows waiting on disk (not yet marked stored)."""
        return self._stats.rows

    @property
    def size_bytes(self) -> int:
        """Bytes of the segments waiting on disk (bounded by ``max_bytes``)."""
        return self._stats.bytes

    def stats(self) -> SpoolStats:
        with self._lock:
            return dataclasses.replace(self._stats, dropped_by_table=dict(self._stats.dropped_by_table))

    def rejected_path(self, table: str) -> Path:
        return self.directory / f"rejected-{table}.jsonl"

    # -- writing ------------------------------------------------------------------------------

    def append(self, table: str, events: Sequence[Event]) -> int:
        """Write ``events`` to ``table``'s open segment and fsync; returns how many were written.

        The rest (when the size bound is hit) are dropped: counted in ``stats().dropped_rows``
        and logged. Raises ``OSError`` if the disk refuses the write (then nothing is counted
        as written; the segment is sealed so the next append starts a clean file).
        """
        if table not in TABLES:
            raise ValueError(f"unknown feedback table {table!r}")
        if not events:
            return 0
        lines = [encode(event) + b"\n" for event in events]
        with self._lock:
            self._check_open()
            room = self.max_bytes - self._stats.bytes
            fit, size = 0, 0
            for line in lines:
                if size + len(line) > room:
                    break
                fit, size = fit + 1, size + len(line)
            if fit < len(lines):
                self._note_full(table, len(lines) - fit)
            if fit == 0:
                return 0
            segment = self._open.get(table)
            if segment is None or segment.size >= self.segment_bytes:
                if segment is not None:
                    self._seal(segment)
                segment = self._new_segment(table)
            assert segment.handle is not None
            try:
                segment.handle.write(b"".join(lines[:fit]))
                segment.handle.flush()
                os.fsync(segment.handle.fileno())
            except OSError:
                self._seal(segment)  # re-reads its size; a torn line is quarantined at drain
                raise
            segment.rows += fit
            segment.size += size
            self._stats.rows += fit
            self._stats.bytes += size
            return fit

    def _note_full(self, table: str, dropped: int) -> None:
        self._stats.dropped_rows += dropped
        self._stats.dropped_by_table[table] = self._stats.dropped_by_table.get(table, 0) + dropped
        now = time.monotonic()
        if self._full_logged_at is None or now - self._full_logged_at >= FULL_LOG_EVERY_S:
            self._full_logged_at = now
            log.error(
                "feedback spool %s is full (%d of %d bytes): dropping the newest rows, keeping the "
                "older spooled ones (%d dropped so far; counted in tokenfleet_feedback_dropped_rows_total)",
                self.directory,
                self._stats.bytes,
                self.max_bytes,
                self._stats.dropped_rows,
            )

    def _new_segment(self, table: str) -> _Segment:
        seq = self._next_seq
        self._next_seq += 1
        path = self.directory / f"{seq:012d}-{table}.jsonl"
        segment = _Segment(seq, table, path, 0, 0, path.open("xb"))
        self._fsync_directory()
        self._segments[seq] = segment
        self._open[table] = segment
        return segment

    def _seal(self, segment: _Segment) -> None:
        if segment.handle is not None:
            with contextlib.suppress(OSError):
                segment.handle.close()
            segment.handle = None
            with contextlib.suppress(OSError):
                actual = segment.path.stat().st_size
                self._stats.bytes += actual - segment.size
                segment.size = actual
        if self._open.get(segment.table) is segment:
            del self._open[segment.table]

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- draining -----------------------------------------------------------------------------

    def next_batch(self, max_rows: int) -> SpoolBatch | None:
        """Up to ``max_rows`` events of the oldest segment not yet stored; None when empty.

        The same batch again until it is ``done`` or ``reject``ed (a failed write is retried
        from where it stopped)."""
        with self._lock:
            self._check_open()
            while True:
                if self._cursor is None:
                    if not self._segments:
                        self._stats.rows = self._stats.bytes = 0  # nothing on disk: nothing waits
                        return None
                    self._cursor = self._load(self._segments[min(self._segments)])
                cursor = self._cursor
                if cursor.stored >= len(cursor.events):
                    self._finish(cursor)
                    continue
                events = tuple(cursor.events[cursor.stored : cursor.stored + max_rows])
                return SpoolBatch(cursor.segment.table, events, cursor.segment.seq, cursor.stored)

    def done(self, batch: SpoolBatch) -> None:
        """``batch``'s rows are stored: forget them (the segment file goes with its last row)."""
        with self._lock:
            self._check_open()
            cursor = self._take_cursor(batch)
            cursor.stored += len(batch.events)
            self._stats.rows -= len(batch.events)
            if cursor.stored >= len(cursor.events):
                self._finish(cursor)

    def reject(self, batch: SpoolBatch, error: str) -> None:
        """The store refused ``batch`` for good: quarantine it with ``error`` and go on."""
        with self._lock:
            self._check_open()
            cursor = self._take_cursor(batch)
            self._write_rejected(batch.table, _rejected_lines(batch.table, batch.events, error))
            cursor.stored += len(batch.events)
            self._stats.rows -= len(batch.events)
            if cursor.stored >= len(cursor.events):
                self._finish(cursor)

    def reject_events(self, table: str, events: Sequence[Event], error: str) -> int:
        """Append ``events`` to ``table``'s rejected file with ``error``; returns rows written
        (fewer when the quarantine is full: the rest are dropped, logged and counted)."""
        lines = _rejected_lines(table, events, error)
        with self._lock:
            self._check_open()
            return self._write_rejected(table, lines)

    def _reject_lines(self, table: str, raw: Sequence[tuple[bytes, str]]) -> None:
        lines = [
            json.dumps(
                {
                    "table": table,
                    "error": error,
                    "rejected_at": time.time(),
                    "line": line.decode("utf-8", "replace"),
                }
            ).encode()
            + b"\n"
            for line, error in raw
        ]
        self._write_rejected(table, lines)

    def _write_rejected(self, table: str, lines: Sequence[bytes]) -> int:
        """(Lock held.)"""
        kept = 0
        size = 0
        for line in lines:
            if self._rejected_bytes + size + len(line) > self.rejected_max_bytes:
                break
            kept, size = kept + 1, size + len(line)
        self._stats.rejected_rows += len(lines)
        if self._on_rejected is not None:
            self._on_rejected(table, len(lines))
        if kept < len(lines):
            self._stats.rejected_dropped_rows += len(lines) - kept
            log.error(
                "feedback spool %s: the rejected quarantine is full (%d bytes): %d rejected rows of "
                "%s not kept",
                self.directory,
                self.rejected_max_bytes,
                len(lines) - kept,
                table,
            )
        if kept:
            with self.rejected_path(table).open("ab") as out:
                out.write(b"".join(lines[:kept]))
                out.flush()
                os.fsync(out.fileno())
            self._rejected_bytes += size
        return kept

    def _load(self, segment: _Segment) -> _Cursor:
        self._seal(segment)  # appends from now on go to a new segment
        kind = TABLES[segment.table]
        events: list[Event] = []
        torn: list[tuple[bytes, str]] = []
        for line in segment.path.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                events.append(decode(kind, line))
            except DecodeError as exc:
                torn.append((line, f"undecodable spool line: {exc.reason}"))
        if torn:
            log.warning(
                "feedback spool %s: %d undecodable lines in %s quarantined to %s",
                self.directory,
                len(torn),
                segment.path.name,
                self.rejected_path(segment.table).name,
            )
            self._reject_lines(segment.table, torn)
        self._stats.rows += len(events) - segment.rows  # torn or blank lines are no rows
        segment.rows = len(events)
        return _Cursor(segment, events)

    def _take_cursor(self, batch: SpoolBatch) -> _Cursor:
        cursor = self._cursor
        if cursor is None or cursor.segment.seq != batch.seq or cursor.stored != batch.start:
            raise ValueError("not the spool's current batch")
        return cursor

    def _finish(self, cursor: _Cursor) -> None:
        segment = cursor.segment
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()
        self._stats.bytes -= segment.size
        del self._segments[segment.seq]
        self._cursor = None

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the feedback spool {self.directory} is closed")

    def close(self) -> None:
        """Seal the open segments and release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            for segment in list(self._open.values()):
                self._seal(segment)
            self._closed = True
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()


def _rejected_lines(table: str, events: Sequence[Event], error: str) -> list[bytes]:
    head = json.dumps({"table": table, "error": error, "rejected_at": time.time()})[:-1].encode()
    return [head + b', "event": ' + encode(event) + b"}\n" for event in events]
