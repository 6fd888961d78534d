"""Wire contracts of TokenFleet: event models, topic names and keys, JSON Schema export."""

from schemas.events import (
    EVENT_TYPES,
    AdmissionDecision,
    BatchJob,
    ChatMessage,
    Completion,
    DeadLetter,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    KvEvent,
    ReplicaPlan,
    Response,
    ResponseStarted,
    RoutingDecision,
    Sampling,
)

__all__ = [
    "EVENT_TYPES",
    "AdmissionDecision",
    "BatchJob",
    "ChatMessage",
    "Completion",
    "DeadLetter",
    "Event",
    "FleetEvent",
    "Heartbeat",
    "InferenceRequest",
    "KvEvent",
    "ReplicaPlan",
    "Response",
    "ResponseStarted",
    "RoutingDecision",
    "Sampling",
]
