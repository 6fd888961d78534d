"""The broker of a lab stack: the embedded Kafka broker (Tansu, memory storage) with the
project's topics, or a broker given by its bootstrap."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from infra.kafka.broker import embedded_broker, ensure_topics, ensure_topics_async
from infra.kafka.connection import KafkaConnection

PARTITIONS = 4
"""Partitions per topic the lab creates unless told otherwise (the settings' default)."""


@contextlib.contextmanager
def broker(
    bootstrap: str | None = None,
    *,
    partitions: int = PARTITIONS,
    log_path: Path | None = None,
    topics: Sequence[str] | None = None,
) -> Iterator[str]:
    """A broker for the block, with the project's topics (or ``topics``; ``()``: none) created
    where missing, ``partitions`` each: ``bootstrap`` if given (left running), else an embedded
    broker started here (its output appended to ``log_path``) and stopped on exit.

    Synchronous (it creates topics with its own event loop): call it outside an event loop;
    inside one, use ``EmbeddedBroker`` or ``Stack``."""
    if bootstrap:
        if topics != ():
            ensure_topics(KafkaConnection.plaintext(bootstrap), partitions, topics)
        yield bootstrap
        return
    with embedded_broker(log_path=log_path) as started:
        if topics != ():
            ensure_topics(KafkaConnection.plaintext(started), partitions, topics)
        yield started


class EmbeddedBroker:
    """An embedded broker that can be stopped and started again on its port: a broker outage.

    Its storage is memory: a broker started again has an empty log, no committed offsets, no
    consumer groups, and no topics (``start`` creates them again, as an operator would). Every
    start appends its output to ``log_path``."""

    def __init__(self, log_path: Path | None = None, partitions: int = PARTITIONS) -> None:
        self.log_path, self.partitions = log_path, partitions
        self.bootstrap = ""
        self._running: contextlib.AbstractContextManager[str] | None = None

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    @property
    def running(self) -> bool:
        return self._running is not None

    async def start(self, port: int | None = None) -> str:
        """Start it on ``port`` (its previous one, for a restart) or a free one, create the
        topics, return the bootstrap. Blocks the loop until it listens (at most 20 s)."""
        manager = embedded_broker(log_path=self.log_path, port=port)
        self.bootstrap = manager.__enter__()
        self._running = manager  # stopped by ``stop`` even if creating the topics fails
        await ensure_topics_async(KafkaConnection.plaintext(self.bootstrap), self.partitions)
        return self.bootstrap

    def stop(self) -> None:
        """Stop it (its log goes with it); nothing if it does not run."""
        if self._running is not None:
            manager, self._running = self._running, None
            manager.__exit__(None, None, None)
