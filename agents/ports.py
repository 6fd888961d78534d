"""What the streaming agents need from the outside, as small interfaces the wiring fills in.

The worker's wiring (``worker/wiring.py``) provides the Faust-table-backed ``InstanceState``
(``streams/snapshot.py``), the Kafka ``Publisher`` (``streams/binding.py``) and a
Prometheus-backed ``Telemetry``; the functional tests inject fakes (``tests/functional/fakes.py``).
There is no store port: the agents never write rows; the store is fed from the topics
(``infra/clickhouse/topic_sink.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from agents.policy.types import ClusterView
from agents.routing import Routed
from schemas.events import Event, FleetEvent, Heartbeat, InferenceRequest
from schemas.topics import TopicSpec


class InstanceState(Protocol):
    """The instance-state table: each instance's latest heartbeat, per model pool."""

    def record(self, beat: Heartbeat) -> None:
        """Keep ``beat`` as its instance's latest state (durably: the table has a changelog).
        Called from the heartbeat agent, one event at a time."""

    def view(self, pool: str) -> ClusterView | None:
        """The pool's snapshot, ``None`` if no instance of it has reported. The same object (and
        ``version``) until a heartbeat changes the pool."""


class PromptCompleter(Protocol):
    async def complete_off_loop(self, request: InferenceRequest) -> InferenceRequest:
        """``request`` with its prompt's ``input_tokens`` and ``prompt_block_hashes`` filled in
        (unchanged when it has no prompt or carries both), a long prompt tokenized off the event
        loop so that other work goes on meanwhile. Raises ``ValueError`` with a one-line reason
        when it cannot (the request is dead-lettered with it)."""
        ...


class Publisher(Protocol):
    async def send(self, spec: TopicSpec, events: Sequence[Event]) -> Awaitable[object]:
        """Queue ``events`` on ``spec``'s topic (keyed per the spec); the result completes when
        the broker has them all. Events of one call keep their order per partition."""


class Telemetry(Protocol):
    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        """``outcomes`` of one batch, decided and handed to the producer ``latency_s`` seconds
        after the batch reached the worker."""

    def dead_lettered(self, topic: str) -> None: ...

    def queue_depth(self, pool: str, depth: int) -> None: ...

    def placements_observed(self, pool: str, count: int) -> None:
        """``count`` placements of other deciders of ``pool`` applied to this one's accounting."""

    def fleet_events(self, events: Sequence[FleetEvent]) -> None:
        """FleetMind's notices, as published on ``tf.fleet-events`` (counted by kind and DC)."""
