"""Wire contracts: one frozen pydantic model per event kind.

Every event carries ``event_id`` (unique; sinks deduplicate on it, so a redelivered event never
double-counts), ``ts`` (seconds since the epoch when the event was made) and
``schema_version``. Unknown fields are rejected (``extra="forbid"``): a producer that sends
something we do not understand gets its event dead-lettered with the reason, not half-read.
Nothing here imports the rest of the project.
"""

from __future__ import annotations

import os
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


def new_event_id() -> str:
    """128 random bits as hex (what uuid4().hex carries, at a fifth of its cost)."""
    return os.urandom(16).hex()


class Event(BaseModel):
    """Common header of every event."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=new_event_id, min_length=1, max_length=128)
    ts: float = Field(default_factory=time.time, ge=0)
    schema_version: Literal[1] = SCHEMA_VERSION


class InferenceRequest(Event):
    """A client's request to the fleet. ``output_budget`` is its ``max_tokens`` cap.

    ``prompt_block_hashes``: chained hashes of the prompt's full 512-token blocks (equal hash at
    position i = equal prefix up to block i). ``attempt`` > 1 marks a client retry of the same
    ``request_id``. ``deadline_ts``: absolute deadline (batch). ``allowed_regions``: data
    centres the tenant's residency rules allow (empty = any). ``home_dc``: the data centre the
    request entered the fleet at (empty = no preference).
    """

    request_id: str = Field(min_length=1, max_length=256)
    attempt: int = Field(default=1, ge=1)
    tenant: str = Field(default="default", min_length=1)
    model: str = Field(min_length=1)
    task_type: str = "chat"
    prompt_block_hashes: tuple[int, ...] = ()
    input_tokens: int = Field(ge=1)
    output_budget: int = Field(ge=1)
    slo_class: str | None = None
    deadline_ts: float | None = None
    allowed_regions: tuple[str, ...] = ()
    home_dc: str = Field(default="", max_length=128)
    true_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Emulation only: how many tokens the emulated engine will generate. "
        "Policies never read it; real clients leave it empty.",
    )


class BatchJob(Event):
    """An offline job: many requests sharing one deadline (seconds from submission)."""

    job_id: str = Field(min_length=1)
    tenant: str = "default"
    deadline_s: float = Field(gt=0)
    requests: tuple[InferenceRequest, ...] = Field(min_length=1)


class Heartbeat(Event):
    """An instance's state report. KV in blocks of 512 tokens."""

    instance_id: str = Field(min_length=1)
    dc: str
    model: str
    model_version: str
    profile: str = ""
    endpoint_ready: bool = True
    waiting: int = Field(ge=0)
    running: int = Field(ge=0)
    tokens_in_flight: int = Field(ge=0)
    kv_blocks_used: int = Field(ge=0)
    kv_blocks_total: int = Field(ge=1)


class KvEvent(Event):
    """Blocks stored in or removed from one instance's prefix cache."""

    instance_id: str = Field(min_length=1)
    model: str
    kind: Literal["stored", "removed"]
    block_hashes: tuple[int, ...]


class ResponseStarted(Event):
    """The first token of one request attempt left its instance (what a proxy sees first)."""

    request_id: str = Field(min_length=1)
    attempt: int = Field(default=1, ge=1)
    instance_id: str
    model: str
    ttft_s: float = Field(ge=0, description="arrival at the scheduler -> this first token")


class Completion(Event):
    """The end of one request attempt on an instance."""

    request_id: str = Field(min_length=1)
    attempt: int = Field(default=1, ge=1)
    instance_id: str
    model: str
    tenant: str = "default"
    slo_class: str = "interactive"
    status: Literal["ok", "timeout", "aborted", "error"]
    arrival_ts: float = Field(ge=0, description="when the request reached the scheduler")
    ttft_s: float | None = Field(default=None, ge=0)
    tpot_s: float | None = Field(default=None, ge=0)
    e2e_s: float | None = Field(default=None, ge=0)
    input_tokens: int = Field(ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(ge=0)
    deadline_ts: float | None = None


class AdmissionDecision(Event):
    """The admission stage's answer: admit now, hold in ``queue_pool``, or reject, with the
    reason and the predicted TTFT it was based on (if the stage predicts one)."""

    request_id: str
    attempt: int = 1
    tenant: str = "default"
    model: str
    slo_class: str
    action: Literal["admit", "queue", "reject"]
    reason: str = ""
    policy: str
    queue_pool: str = ""
    predicted_ttft_s: float | None = None


class RoutingDecision(Event):
    """Where a request runs: data centre and instance, with the prediction it was based on."""

    request_id: str
    attempt: int = 1
    tenant: str = "default"
    model: str
    slo_class: str
    dc: str
    instance_id: str
    policy: str
    reason: str = ""
    predicted_ttft_s: float | None = None
    decision_latency_s: float = Field(ge=0, description="time the policy spent on it, seconds")
    worker: str = Field(default="", description="the scheduler worker that decided (host:pid)")
    request: InferenceRequest


class DeadLetter(Event):
    """An input that could not be processed: the original bytes (base64) and why."""

    source_topic: str
    reason: str
    original_b64: str
    original_key_b64: str | None = None


EVENT_TYPES: tuple[type[Event], ...] = (
    InferenceRequest,
    BatchJob,
    Heartbeat,
    KvEvent,
    ResponseStarted,
    Completion,
    AdmissionDecision,
    RoutingDecision,
    DeadLetter,
)
