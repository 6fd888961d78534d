"""Topic names and what each is keyed by, defined once."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import (
    AdmissionDecision,
    BatchJob,
    Completion,
    DeadLetter,
    DeciderAnnouncement,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    KvEvent,
    ReplicaPlan,
    Response,
    ResponseStarted,
    RoutingDecision,
)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    event: type[Event]
    key: str  # the field the message key is taken from


# A pool's requests spread over the partitions by their affinity key (the pool and the prompt's
# first blocks, else the tenant): each partition is one decider's share, and the decisions that
# settle a request land on the same partition number as the request (a decider taking over a
# partition replays its decisions). Every decider reads the pool's state topics whole.
REQUESTS = TopicSpec("tf.requests", InferenceRequest, "affinity_key")
ADMISSION = TopicSpec("tf.admission", AdmissionDecision, "affinity_key")
DECISIONS = TopicSpec("tf.decisions", RoutingDecision, "affinity_key")
HEARTBEATS = TopicSpec("tf.heartbeats", Heartbeat, "model")
KV_EVENTS = TopicSpec("tf.kv-events", KvEvent, "model")
FIRST_TOKENS = TopicSpec("tf.first-tokens", ResponseStarted, "model")
COMPLETIONS = TopicSpec("tf.completions", Completion, "model")
BATCH_JOBS = TopicSpec("tf.batch.jobs", BatchJob, "job_id")
DLQ = TopicSpec("tf.dlq", DeadLetter, "source_topic")
# What FleetMind tells operators (DC state changes, reservation moves, replica advice), per pool.
FLEET_EVENTS = TopicSpec("tf.fleet-events", FleetEvent, "model")
# Answers are for the client that asked, not for a pool's worker: keyed by request id.
RESPONSES = TopicSpec("tf.responses", Response, "request_id")
# Where each decider can be asked directly and which request partitions it owns, for gateways.
DECIDERS = TopicSpec("tf.deciders", DeciderAnnouncement, "worker")
# The fleet's desired shape (replicas per model version and DC) from the one active planner.
PLANS = TopicSpec("tf.plans", ReplicaPlan, "model")

ALL_TOPICS = (
    REQUESTS,
    HEARTBEATS,
    KV_EVENTS,
    FIRST_TOKENS,
    COMPLETIONS,
    ADMISSION,
    DECISIONS,
    BATCH_JOBS,
    DLQ,
    RESPONSES,
    FLEET_EVENTS,
    DECIDERS,
    PLANS,
)


def key_of(spec: TopicSpec, event: Event) -> bytes:
    return str(getattr(event, spec.key)).encode()
