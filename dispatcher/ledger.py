"""The dispatcher's ledger: what it has started, where that stands on the log, and what it answered.

Two records, so a dispatcher that dies loses nothing and re-runs only what it had in flight:

- **Open attempts hold the commit back.** A decision's offset on ``tf.decisions`` is committed
  only once its attempt has ended *and* its end (the ``Response`` and ``Completion``) was
  delivered to the broker. Per partition the offset to commit is

      commit(p) = min(offset of the oldest open attempt read from p, end of what was read from p)

  so a dispatcher killed at any moment is replaced by one that reads again exactly the
  decisions whose end was not delivered (those open at the kill) and the ones after them.
- **Answers are kept, and given again.** The answers delivered (``Response``, keyed by request
  id and attempt), the newest ``kept``; a new dispatcher first reads back those of the last
  ``lookback_s`` from ``tf.responses`` (``recall``). A decision about an attempt already
  answered is not run again: its answer is sent again, the same event (a client resent a
  request whose answer a broker lost, the scheduler published the decision again; or a new
  dispatcher read again a decision behind an open one). Clients collapse answers by request id.

Offsets refer to one log: when the broker loses its log (``log_lost``), the open attempts of
those partitions hold their commit at 0 until they end; a new consumer (``reconnected``)
commits only past what it read itself, never an offset an earlier consumer read (that offset
may belong to a log the broker has since lost: committed into the new log, it would skip the
decisions written there before it).

Ends are kept too, for a broker that loses its log: a ``Completion`` the broker acknowledged
and lost before the store's consumer read it exists nowhere else, and no client resends for
it (its answer came). ``recent_ends`` are the completions delivered in the last seconds, sent
again (the same events: the store keeps each event id once) when the log is found lost;
``log_restarted`` tells, from the ends the broker reports for ``tf.completions`` after a
reconnect, whether it lost what it had acknowledged (a log's end never goes down otherwise).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from infra.kafka.clients import TopicsMissing, partition_reader
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import Completion, Response
from schemas.topics import RESPONSES

Key = tuple[str, int]  # (request id, attempt)
ANSWERS_KEPT = 20_000
LOOKBACK_S = 900.0


class Ledger:
    """Open attempts by decision position, and the answers given (module docstring)."""

    def __init__(self, kept: int = ANSWERS_KEPT) -> None:
        self.kept = kept
        self._open: dict[Key, tuple[Any, int]] = {}  # attempt -> (partition, offset) of its decision
        self._read_to: dict[Any, int] = {}  # partition -> offset after the last decision read
        self._committed: dict[Any, int] = {}
        self._answers: OrderedDict[Key, Response] = OrderedDict()
        self._ends: OrderedDict[str, tuple[float, Completion]] = (
            OrderedDict()
        )  # event id -> (delivered at, it)
        self._ends_acked: dict[int, int] = {}  # tf.completions partition -> end of ours acknowledged

    @property
    def open_attempts(self) -> int:
        return len(self._open)

    def answer(self, request_id: str, attempt: int) -> Response | None:
        """The answer already given to this attempt, if it is still kept."""
        return self._answers.get((request_id, attempt))

    def started(self, request_id: str, attempt: int, partition: Any, offset: int) -> None:
        """The decision at ``offset`` of ``partition`` started this attempt on an engine."""
        self._open[(request_id, attempt)] = (partition, offset)

    def read(self, partition: Any, next_offset: int) -> None:
        """Every decision of ``partition`` before ``next_offset`` was read and handled."""
        self._read_to[partition] = next_offset

    def delivered(self, events: Iterable[object], now: float | None = None) -> None:
        """These engine events reached the broker: a ``Completion`` closes its attempt and is
        kept (``recent_ends``); a ``Response`` is kept as its answer."""
        now = time.time() if now is None else now
        for event in events:
            if isinstance(event, Completion):
                self._open.pop((event.request_id, event.attempt), None)
                self._ends[event.event_id] = (now, event)
                self._ends.move_to_end(event.event_id)
                while len(self._ends) > self.kept:
                    self._ends.popitem(last=False)
            elif isinstance(event, Response):
                self.keep(event)

    def acknowledged_end(self, partition: int, offset: int) -> None:
        """The broker acknowledged a completion of ours at ``offset`` of ``tf.completions``'
        ``partition``."""
        self._ends_acked[partition] = max(offset + 1, self._ends_acked.get(partition, 0))

    def log_restarted(self, ends: Mapping[int, int]) -> bool:
        """Whether the broker lost what it acknowledged: ``ends`` (partition -> end offset of
        ``tf.completions`` now) below the end of a completion it acknowledged. Forgets the old
        acknowledgements either way (the next ones are of the log as it is now)."""
        lost = any(ends.get(p, 0) < end for p, end in self._ends_acked.items())
        self._ends_acked.clear()
        return lost

    def recent_ends(self, since: float) -> list[Completion]:
        """The completions delivered at or after ``since`` (wall clock), oldest first."""
        return [event for at, event in self._ends.values() if at >= since]

    def reconnected(self) -> None:
        """A new consumer reads the decisions: commit only past what it reads (module docstring)."""
        self._read_to.clear()
        self._committed.clear()

    def keep(self, response: Response) -> None:
        key = (response.request_id, response.attempt)
        self._answers[key] = response
        self._answers.move_to_end(key)
        while len(self._answers) > self.kept:
            self._answers.popitem(last=False)

    def to_commit(self, assigned: Iterable[Any]) -> dict[Any, int]:
        """The offsets to commit now on the ``assigned`` partitions (module docstring), only
        those that moved since the last call."""
        floor: dict[Any, int] = {}
        for partition, offset in self._open.values():
            floor[partition] = min(offset, floor.get(partition, offset))
        due = {}
        for partition in assigned:
            end = self._read_to.get(partition)
            if end is None:
                continue
            offset = min(end, floor.get(partition, end))
            if self._committed.get(partition) != offset:
                due[partition] = offset
        self._committed.update(due)
        return due

    def log_lost(self, partitions: Iterable[Any]) -> None:
        """The broker lost the log of ``partitions``: the positions known there mean nothing
        in the new one; what is open there holds its commit at 0 until it ends."""
        lost = set(partitions)
        for key, (partition, _) in list(self._open.items()):
            if partition in lost:
                self._open[key] = (partition, 0)
        for partition in lost:
            self._read_to.pop(partition, None)
            self._committed.pop(partition, None)
        self._ends_acked.clear()  # (acknowledged by the log that is gone)

    async def recall(
        self, connection: KafkaConnection, lookback_s: float = LOOKBACK_S, idle_s: float = 1.0
    ) -> int:
        """Read back the answers of the last ``lookback_s`` from ``tf.responses`` (up to their
        end now); how many. Nothing if the topic does not exist yet."""
        try:
            consumer = await partition_reader(connection, [RESPONSES], "end", "ledger reader")
        except TopicsMissing:
            return 0
        try:
            partitions = list(consumer.assignment())
            ends = {tp: await consumer.position(tp) for tp in partitions}
            since_ms = int((time.time() - lookback_s) * 1000)
            starts = await consumer.offsets_for_times(dict.fromkeys(partitions, since_ms))
            for tp in partitions:
                at = starts.get(tp)
                consumer.seek(tp, ends[tp] if at is None else at.offset)
            remaining = {tp for tp in partitions if await consumer.position(tp) < ends[tp]}
            count = 0
            while remaining:
                batches = await consumer.getmany(timeout_ms=int(idle_s * 1000), max_records=2000)
                if not batches:
                    break  # nothing more comes: the ends were reached or the log is shorter
                for tp, records in batches.items():
                    for record in records:
                        try:
                            self.keep(decode(Response, record.value))
                            count += 1
                        except DecodeError:
                            continue
                    if records and records[-1].offset + 1 >= ends[tp]:
                        remaining.discard(tp)
            return count
        finally:
            await consumer.stop()
