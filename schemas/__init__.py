"""Wire contracts of TokenFleet: event models, topic names and keys, JSON Schema export."""

from schemas.events import (
    EVENT_TYPES,
    AdmissionDecision,
    BatchJob,
    Completion,
    DeadLetter,
    Event,
    Heartbeat,
    InferenceRequest,
    KvEvent,
    ResponseStarted,
    RoutingDecision,
)

__all__ = [
    "EVENT_TYPES",
    "AdmissionDecision",
    "BatchJob",
    "Completion",
    "DeadLetter",
    "Event",
    "Heartbeat",
    "InferenceRequest",
    "KvEvent",
    "ResponseStarted",
    "RoutingDecision",
]
