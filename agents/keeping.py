"""The log's keeper: every message of the shared topics checked and dead-lettered once.

Every decider reads the state topics whole (heartbeats, KV events, first tokens, completions,
decisions) to keep its own view; if each also dead-lettered what it read, every dead letter
would be written once per decider. So that job belongs to whoever the consumer group gave the
message's partition: ``LogKeeper`` (``streams/binding.py`` runs it on Faust's group consumer),
which decodes a batch and sends what does not decode to ``tf.dlq`` with its reason. Storing
the rows is not its job: the store's own consumer reads them from the topics
(``infra/clickhouse/topic_sink.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from agents.ports import Publisher, Telemetry
from schemas import topics
from schemas.codec import DecodeError, RawMessage, dead_letter, decode
from schemas.events import Completion, Event, Heartbeat, KvEvent, ResponseStarted

E = TypeVar("E", bound=Event)


def decode_all(
    kind: type[E], messages: Sequence[RawMessage]
) -> tuple[list[tuple[E, RawMessage]], list[tuple[RawMessage, str]]]:
    """Each message decoded as ``kind`` with the raw message it came from, and what did not
    decode with the reason."""
    good, dead = [], []
    for message in messages:
        try:
            good.append((decode(kind, message[1]), message))
        except DecodeError as exc:
            dead.append((message, exc.reason))
    return good, dead


async def send_dead_letters(
    publisher: Publisher, telemetry: Telemetry, spec: topics.TopicSpec, dead: Sequence[tuple[RawMessage, str]]
) -> None:
    """Send each (message, reason) read from ``spec`` to ``tf.dlq``; wait until the broker has them."""
    if not dead:
        return
    letters = [dead_letter(spec.name, value, key, reason) for (key, value), reason in dead]
    for _ in letters:
        telemetry.dead_lettered(spec.name)
    await (await publisher.send(topics.DLQ, letters))


class LogKeeper:
    """Checks and dead-letters the messages of the partitions it was given."""

    def __init__(self, publisher: Publisher, telemetry: Telemetry) -> None:
        self.publisher, self.telemetry = publisher, telemetry

    async def keep_heartbeats(self, messages: Sequence[RawMessage]) -> None:
        await self._checked(Heartbeat, topics.HEARTBEATS, messages)

    async def keep_completions(self, messages: Sequence[RawMessage]) -> None:
        await self._checked(Completion, topics.COMPLETIONS, messages)

    async def keep_kv_events(self, messages: Sequence[RawMessage]) -> None:
        await self._checked(KvEvent, topics.KV_EVENTS, messages)

    async def keep_first_tokens(self, messages: Sequence[RawMessage]) -> None:
        await self._checked(ResponseStarted, topics.FIRST_TOKENS, messages)

    async def _checked(
        self, kind: type[E], spec: topics.TopicSpec, messages: Sequence[RawMessage]
    ) -> list[E]:
        good, dead = decode_all(kind, messages)
        await send_dead_letters(self.publisher, self.telemetry, spec, dead)
        return [event for event, _ in good]
