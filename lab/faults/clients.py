"""The fault suite's measuring apparatus on the broker: the collector of what the system did,
the publisher that remembers what was acknowledged, and the audit of what a broker serves.

They are built on the lab stack's ``Collector`` and ``Publisher``; what they keep is what the
figures need (``lab.faults``), nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from infra.kafka.clients import start_client
from infra.kafka.connection import KafkaConnection
from infra.kafka.request_client import RequestClient
from lab import stack
from lab.faults import MAX_MESSAGE_BYTES, MODEL
from lab.faults.tally import Key
from schemas.codec import encode
from schemas.events import InferenceRequest
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ, REQUESTS


@dataclass(frozen=True, slots=True)
class Decided:
    key: Key
    at: float  # the decision record's timestamp, seconds
    worker: str
    event_id: str
    partition: int = -1  # of tf.decisions: the same number as its request's on tf.requests


class Collector(stack.Collector):
    """Reads the decision, admission, completion and dead-letter topics from their start (no
    consumer group: every partition), keeping what the figures need. Survives a broker restart
    as far as aiokafka does (out-of-range offsets on a new, empty log reset to the earliest);
    ``restart`` (a new consumer from offset 0, what was seen kept) makes sure nothing is missed."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(
            bootstrap,
            [DECISIONS, ADMISSION, COMPLETIONS, DLQ],
            max_records=5000,
            what="fault collector",
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
        )
        self.decisions: list[Decided] = []
        self.admissions: list[tuple[Key, str]] = []
        self.completions: list[tuple[Key, str, str]] = []  # key, event id, status
        self.dead_letters: list[tuple[str, str, str]] = []  # sha256, source topic, reason
        self.undecodable = 0
        self.completions_before_restart = 0  # completions read from the broker before its restart

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        for record in records:
            self._keep(topic, record.value, record.timestamp / 1e3, record.partition)

    def _keep(self, topic: str, value: bytes | None, at: float, partition: int = -1) -> None:
        try:
            data = json.loads(value or b"")
            if topic == DECISIONS.name:
                self.decisions.append(
                    Decided(
                        (data["request_id"], data["attempt"]),
                        at,
                        data.get("worker", ""),
                        data["event_id"],
                        partition,
                    )
                )
            elif topic == ADMISSION.name:
                self.admissions.append(((data["request_id"], data["attempt"]), data["action"]))
            elif topic == COMPLETIONS.name:
                key = (data["request_id"], data["attempt"])
                self.completions.append((key, data["event_id"], data["status"]))
            elif topic == DLQ.name:
                self.dead_letters.append((data["original_sha256"], data["source_topic"], data["reason"]))
        except (ValueError, KeyError, TypeError):
            self.undecodable += 1

    def decided(self, keys: set[Key]) -> int:
        return len({d.key for d in self.decisions if d.key in keys})

    def dump(self, path: Path) -> None:
        """Write what was collected, one JSON line per record (``kind`` first): the evidence
        behind the figures, kept with the workers' logs in the run's data dir."""
        with path.open("w") as out:
            for d in self.decisions:
                line = {"kind": "decision", "key": d.key, "at": d.at, "worker": d.worker}
                out.write(json.dumps({**line, "event_id": d.event_id, "partition": d.partition}) + "\n")
            for key, action in self.admissions:
                out.write(json.dumps({"kind": "admission", "key": key, "action": action}) + "\n")
            for key, event_id, status in self.completions:
                line = {"kind": "completion", "key": key, "event_id": event_id, "status": status}
                out.write(json.dumps(line) + "\n")

    def answered_admissions(self, keys: set[Key]) -> int:
        return len({key for key, _ in self.admissions if key in keys})

    def completed(self, keys: set[Key]) -> int:
        return len({key for key, _, _ in self.completions if key in keys})

    async def restart(self) -> None:
        """After a broker restart: what was read so far came from the old broker's log."""
        await self.stop()
        self.completions_before_restart = len(self.completions)
        await super().restart()


RESEND_AFTER_S = 10.0  # the fault publisher's clients resend a request unanswered this long


class Publisher:
    """One producer (``lab.stack.Publisher``); remembers each acknowledged valid request's record
    timestamp (and when it was first acknowledged: on which broker incarnation), the bad
    messages and the sends that failed. Its counted valid requests are awaited as a client does
    (``infra.kafka.request_client.RequestClient``: resent, the same event, after
    ``RESEND_AFTER_S`` without an answer); ``never_answered`` is what is still waiting."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.valid: dict[Key, float] = {}  # acknowledged valid requests -> record timestamp (s)
        self.acked_at: dict[Key, float] = {}  # -> time.time() when the acknowledgement came
        self.bad: list[bytes] = []  # bad messages acknowledged
        self.valid_digests: set[str] = set()  # SHA-256 of every counted valid request sent
        self.out = stack.Publisher(
            bootstrap,
            "fault publisher",
            linger_ms=5,
            max_request_size=MAX_MESSAGE_BYTES,
            request_timeout_ms=10_000,
            acks=1,
        )
        self.answers = RequestClient(
            KafkaConnection.plaintext(bootstrap), RESEND_AFTER_S, give_up_after_s=3600.0, send=self._resend
        )

    @property
    def never_answered(self) -> int:
        """Counted valid requests whose client has had no answer (a Response, or a reject)."""
        return self.answers.waiting + self.answers.given_up

    @property
    def failed(self) -> int:
        """Sends the broker never acknowledged."""
        return self.out.failed

    async def start(self) -> None:
        await self.out.start()
        await self.answers.start()

    def send(
        self, value: bytes, key: bytes | None = MODEL.encode(), valid: Key | None = None, bad: bool = True
    ) -> None:
        """Queue one message (never blocks the caller); its acknowledgement is recorded later.
        ``valid``: the key of a counted valid request; else a bad message (unless ``bad=False``)."""
        self.out.send(REQUESTS.name, value, key, functools.partial(self._acked, value, valid, bad))

    def _acked(self, value: bytes, valid: Key | None, bad: bool, metadata: Any) -> None:
        if valid is None:
            if bad:
                self.bad.append(value)
        else:
            self.valid.setdefault(valid, metadata.timestamp / 1e3)  # (a resend's ack is later)
            self.acked_at.setdefault(valid, time.time())

    def request(self, request: InferenceRequest, counted: bool = True) -> None:
        """Send a valid request; ``counted=False`` (warm-up): not one of the figures' requests."""
        raw = encode(request)
        if counted:
            self.valid_digests.add(hashlib.sha256(raw).hexdigest())
            self.send(raw, request.affinity_key.encode(), (request.request_id, request.attempt))
            self.answers.track(request)
        else:
            self.send(raw, request.affinity_key.encode(), None, bad=False)

    async def _resend(self, request: InferenceRequest) -> None:
        self.send(encode(request), request.affinity_key.encode(), (request.request_id, request.attempt))

    async def flush(self, timeout_s: float = 40.0) -> None:
        await self.out.flush(timeout_s)

    async def stop(self) -> None:
        await self.answers.stop()
        await self.out.stop()


@dataclass
class BrokerLog:
    """What a broker serves, read from offset 0 of every partition: the keys of the requests
    and decisions, the completion event ids, and how many offsets hold more than one record."""

    request_keys: set[Key] = field(default_factory=set)
    decision_keys: set[Key] = field(default_factory=set)
    completion_ids: set[str] = field(default_factory=set)
    collisions: int = 0
    collided_decision_keys: set[Key] = field(default_factory=set)  # at an offset holding two records
    collided_completion_ids: set[str] = field(default_factory=set)

    @classmethod
    async def read(cls, bootstrap: str, idle_s: float = 2.0) -> BrokerLog:
        served = cls()
        consumer = await start_client(
            lambda: AIOKafkaConsumer(
                REQUESTS.name,
                DECISIONS.name,
                COMPLETIONS.name,
                bootstrap_servers=bootstrap,
                group_id=None,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
                fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
            ),
            "fault audit",
        )
        offsets: Counter[tuple[str, int, int]] = Counter()
        at: dict[tuple[str, int, int], list[Key | str]] = {}
        try:
            while batch := await consumer.getmany(timeout_ms=int(idle_s * 1000), max_records=5000):
                for tp, records in batch.items():
                    for record in records:
                        where = (tp.topic, tp.partition, record.offset)
                        offsets[where] += 1
                        kept = served._keep(tp.topic, record.value)
                        if kept is not None:
                            at.setdefault(where, []).append(kept)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout=10)
        served.collisions = sum(1 for n in offsets.values() if n > 1)
        # A live consumer reads one of the records at a collided offset and moves past the
        # other: those are the broker's to answer for, like the records it does not serve.
        for where, n in offsets.items():
            if n > 1 and where[0] != REQUESTS.name:
                for kept in at.get(where, []):
                    if isinstance(kept, str):
                        served.collided_completion_ids.add(kept)
                    else:
                        served.collided_decision_keys.add(kept)
        return served

    def _keep(self, topic: str, value: bytes | None) -> Key | str | None:
        """Record what ``value`` is; return its completion id or (request id, attempt)."""
        try:
            data = json.loads(value or b"")
            if topic == COMPLETIONS.name:
                self.completion_ids.add(data["event_id"])
                return str(data["event_id"])
            keys = self.request_keys if topic == REQUESTS.name else self.decision_keys
            key = (data["request_id"], data["attempt"])
            keys.add(key)
            return key
        except (ValueError, KeyError, TypeError):
            return None  # a bad request: the fuzz scenarios count those, not the audit
