"""Wire contracts: one frozen pydantic model per event kind.

Every event carries ``event_id`` (unique; sinks deduplicate on it, so a redelivered event never
double-counts), ``ts`` (seconds since the epoch when the event was made) and
``schema_version``. Unknown fields are rejected (``extra="forbid"``): a producer that sends
something we do not understand gets its event dead-lettered with the reason, not half-read.

Every field is bounded and every float finite (no NaN or infinity anywhere), with limits chosen
to fit what the values feed (ClickHouse columns, ``datetime`` conversions, numpy int64
arithmetic): an event either validates and can be routed, stored and summarised, or is
rejected when it is decoded (and dead-lettered with the reason), never accepted only to break a
later step. The limits are the constants below.
Nothing here imports the rest of the project.
"""

from __future__ import annotations

import math
import os
import time
from typing import Annotated, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION: Literal[1] = 1

# --- limits ---------------------------------------------------------------------------------------

MAX_TS = 4_102_444_800.0
"""Latest timestamp (2100-01-01 UTC): fits DateTime64(3) (to 2299) and the roll-up's DateTime (to 2106)."""
MAX_ATTEMPT = 1_000
"""Most attempts of one request: far beyond any retry policy; the ``attempt`` columns are UInt16."""
MAX_TOKENS = 10_000_000
"""Most tokens of any count: far above any model's context; the token columns are UInt32."""
MAX_DURATION_S = 1_000_000.0
"""Longest duration (TTFT, TPOT, E2E, decision latency, prediction): 11.6 days, no real latency."""
MAX_COUNT = 1_000_000_000
"""Largest heartbeat count (queue, batch, tokens, KV blocks): int64 sums over a pool cannot overflow."""
MAX_TOTAL = 2**53
"""Largest cumulative counter (an engine's prefix-cache tokens since start): exact as a float."""
MAX_EVENT_ID_LENGTH = 128
"""Event ids are 32 hex characters when we make them; room for other producers' schemes."""
MAX_NAME_LENGTH = 256
"""Ids and names (request, tenant, model, DC, instance, profile, policy, pool, ...): keys, not text."""
MAX_PARTITIONS = 10_000
"""Partitions of one topic, at most (far beyond what a deployment of ours uses)."""
MAX_HOME_DC_LENGTH = 128
"""``home_dc`` kept at its original limit (a DC name, well under ``MAX_NAME_LENGTH``)."""
MAX_REASON_LENGTH = 1_024
"""A reason is one readable line, not a payload."""
MAX_BLOCK_HASHES = 20_000
AFFINITY_BLOCKS = 4  # prompt blocks (of 512 tokens) that choose a request's decider
"""Most block hashes in one event: every full 512-token block of a ``MAX_TOKENS`` prompt (19 531),
and small enough that a routing decision embedding the request (~0.4 MB of JSON) stays under
the 1 MB a Kafka producer sends by default."""
MIN_BLOCK_HASH, MAX_BLOCK_HASH = -(2**63), 2**63 - 1
"""A block hash is a signed 64-bit int (what Python's ``hash`` gives; numpy int64 in the index)."""
MAX_DEAD_LETTER_ORIGINAL = 256 * 1024
"""Bytes of a bad input a dead letter carries: base64 of it stays far below the 1 MB a Kafka
producer sends by default, so even a 5 MB bad message can be dead-lettered."""
MAX_REGIONS = 64
"""Most data centres one request may be allowed in: more than any fleet has."""
MAX_BATCH_REQUESTS = 10_000
"""Most requests in one batch job (one message; bigger jobs are split by the client)."""
MAX_BATCH_DEADLINE_S = 10_000_000.0
"""Longest batch deadline: 116 days after submission."""
MAX_PROMPT_CHARS = 200_000
"""Most characters of a prompt (text, or all chat messages together): ~50 000 tokens; a routing
decision embedding it stays well under the 1 MB a Kafka producer sends by default."""
MAX_PROMPT_TOKEN_IDS = 32_768
"""Most token ids of a tokenized prompt (~200 KB of JSON)."""
MAX_TOKEN_ID = 2**31 - 1
MAX_MESSAGES = 512
"""Most messages of one chat request."""
MAX_STOP = 4
"""Most stop sequences (OpenAI's limit)."""
MAX_RESPONSE_CHARS = 400_000
"""Most characters of a response's text on ``tf.responses``."""

Role = Literal["prefill", "decode", "both"]
"""An instance's part in prefill/decode disaggregation (``Heartbeat.role``)."""
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")

# --- bounded field types --------------------------------------------------------------------------

Timestamp = Annotated[float, Field(ge=0, le=MAX_TS)]
Duration = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Total = Annotated[int, Field(ge=0, le=MAX_TOTAL)]
Attempt = Annotated[int, Field(ge=1, le=MAX_ATTEMPT)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
"""A required id or name (never empty)."""
Label = Annotated[str, Field(max_length=MAX_NAME_LENGTH)]
"""A name that may be empty."""
Reason = Annotated[str, Field(max_length=MAX_REASON_LENGTH)]
BlockHash = Annotated[int, Field(ge=MIN_BLOCK_HASH, le=MAX_BLOCK_HASH)]
BlockHashes = Annotated[tuple[BlockHash, ...], Field(max_length=MAX_BLOCK_HASHES)]


def _saturate(value: object) -> object:
    """A finite estimate outside [0, MAX_DURATION_S] taken at the nearest bound: a pessimistic
    prediction (a huge queue) must not fail the decision that carries it. NaN and infinity are
    left to be rejected."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return min(max(float(value), 0.0), MAX_DURATION_S)
    return value


Prediction = Annotated[float, BeforeValidator(_saturate), Field(ge=0, le=MAX_DURATION_S)]
"""A predicted duration (saturated into range, see ``_saturate``; never NaN or infinite)."""


def new_event_id() -> str:
    """128 random bits as hex (what uuid4().hex carries, at a fifth of its cost)."""
    return os.urandom(16).hex()


class Event(BaseModel):
    """Common header of every event."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    event_id: str = Field(default_factory=new_event_id, min_length=1, max_length=MAX_EVENT_ID_LENGTH)
    ts: Timestamp = Field(default_factory=time.time)
    schema_version: Literal[1] = SCHEMA_VERSION


class ChatMessage(BaseModel):
    """One message of a chat request, as the OpenAI chat API names it (text content only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class Sampling(BaseModel):
    """Sampling parameters, by their OpenAI names (``max_tokens`` is the request's
    ``output_budget``). ``ignore_eos`` is vLLM's: generate exactly ``max_tokens`` (benchmarks)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: tuple[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)], ...] = Field(
        default=(), max_length=MAX_STOP
    )
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    ignore_eos: bool = False


class InferenceRequest(Event):
    """A client's request to the fleet. ``output_budget`` is its ``max_tokens`` cap.

    The prompt, for requests real engines execute: at most one of ``prompt`` (a completion),
    ``messages`` (a chat) or ``prompt_token_ids``; with ``sampling``. Requests for the emulated
    fleet carry none and give ``input_tokens``. When a prompt is given, ``input_tokens`` (0 =
    unknown) and ``prompt_block_hashes`` may be left out: the scheduler computes them with the
    model's tokenizer (``infra/prompts.py``) before routing; token ids count themselves.

    ``prompt_block_hashes``: chained hashes of the prompt's full 512-token blocks (equal hash at
    position i = equal prefix up to block i; ``agents.prompt_blocks``). ``attempt`` > 1 marks a
    client retry of the same ``request_id``. ``deadline_ts``: absolute deadline (batch).
    ``allowed_regions``: data centres the tenant's residency rules allow (empty = any).
    ``home_dc``: the data centre the request entered the fleet at (empty = no preference).
    ``model_version``: the version of ``model`` it must run on (empty = the version the fleet's
    rules pin for the model, else any); a scheduler never substitutes another.
    ``reply``: who executes the decision and answers — ``kafka``: the dispatcher, which writes
    the answer to ``tf.responses``; ``http``: the gateway that accepted the request (the
    dispatcher leaves it alone). ``affinity``: which of the pool's deciders hears it, when its
    publisher chose (a hot prefix spread over the deciders, ``agents.affinity``); empty: the
    default (``affinity_key``). ``decided_by``: the decider that a gateway asked directly and that
    decided this request (``streams/direct.py``); this event is the log's record of it, which no
    request lane decides again. Empty: the deciders read it from the log.
    ``session_id``: the user or session that sent it: requests with one id come one after another
    from one client (a replay sends them closed-loop, ``sim/loop/sessions.py``). An opaque key,
    never an end user's own id: the gateway makes it from the OpenAI body's ``user`` (or its
    ``X-TokenFleet-Session`` header) and the tenant (``gateway.openai_api.session_id``). Empty:
    not known.
    """

    request_id: Name
    attempt: Attempt = 1
    tenant: Name = "default"
    model: Name
    task_type: Label = "chat"
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    messages: tuple[ChatMessage, ...] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    prompt_token_ids: tuple[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)], ...] | None = Field(
        default=None, min_length=1, max_length=MAX_PROMPT_TOKEN_IDS
    )
    sampling: Sampling = Sampling()
    reply: Literal["kafka", "http"] = "kafka"
    prompt_block_hashes: BlockHashes = ()
    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    output_budget: int = Field(ge=1, le=MAX_TOKENS)
    slo_class: Label | None = None
    deadline_ts: Timestamp | None = None
    allowed_regions: tuple[Label, ...] = Field(default=(), max_length=MAX_REGIONS)
    home_dc: str = Field(default="", max_length=MAX_HOME_DC_LENGTH)
    model_version: Label = ""
    affinity: Label = ""
    decided_by: Label = ""
    session_id: Label = ""

    @model_validator(mode="after")
    def _one_prompt_and_a_length(self) -> Self:
        given = [f for f in ("prompt", "messages", "prompt_token_ids") if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(
                f"give at most one of prompt, messages, prompt_token_ids (got {', '.join(given)})"
            )
        if self.messages is not None and sum(len(m.content) for m in self.messages) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages hold more than {MAX_PROMPT_CHARS} characters")
        if self.input_tokens == 0:
            if self.prompt_token_ids is not None:
                object.__setattr__(self, "input_tokens", len(self.prompt_token_ids))
            elif not given:
                raise ValueError("input_tokens must be >= 1 when the request carries no prompt")
        return self

    @property
    def has_prompt(self) -> bool:
        return self.prompt is not None or self.messages is not None or self.prompt_token_ids is not None

    @property
    def affinity_key(self) -> str:
        """What spreads a pool's requests over the partitions of ``tf.requests``, so over its
        deciders: the pool and the hash of the prompt's first ``AFFINITY_BLOCKS`` blocks (block
        hashes are chained: the hash names that whole prefix), else the tenant. Requests that
        share a 2 048-token prefix (a conversation's turns, one long system prompt) meet the
        same decider; shorter shared prefixes are spread, and every decider still sees where
        the others placed them (``tf.decisions``) and what the engines cached (``tf.kv-events``).
        A publisher may choose another (``affinity``: a hot prefix spread, ``agents.affinity``)."""
        if self.affinity:
            return f"{self.model}/{self.affinity}"
        hashes = self.prompt_block_hashes
        if hashes:
            return f"{self.model}/{hashes[min(AFFINITY_BLOCKS, len(hashes)) - 1]:x}"
        return f"{self.model}/tenant:{self.tenant}"


class BatchJob(Event):
    """An offline job: many requests sharing one deadline (seconds from submission).

    Valid only if its expansion (``agents.batch.expand_batch_job``: ids prefixed ``JOB/``, due
    at ``ts + deadline_s``) gives valid requests, since the expansion does not validate again.
    """

    job_id: Name
    tenant: Name = "default"
    deadline_s: float = Field(gt=0, le=MAX_BATCH_DEADLINE_S)
    requests: tuple[InferenceRequest, ...] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)

    @model_validator(mode="after")
    def _expands_to_valid_requests(self) -> Self:
        if self.ts + self.deadline_s > MAX_TS:
            raise ValueError(f"ts + deadline_s must be at most {MAX_TS:.0f} (the latest deadline_ts)")
        prefix = f"{self.job_id}/"
        for request in self.requests:
            rid = request.request_id
            if not rid.startswith(prefix) and len(prefix) + len(rid) > MAX_NAME_LENGTH:
                raise ValueError(
                    f"request id {rid[:40]!r}... prefixed with the job id is longer than "
                    f"{MAX_NAME_LENGTH} characters"
                )
        return self


class Heartbeat(Event):
    """An instance's state report. KV in blocks of 512 tokens.

    Each field is what a real engine adapter can produce: a scrape of the engine's Prometheus
    ``/metrics`` (vLLM names below), its health endpoint, its deployment, or TokenFleet's own
    dispatcher counting the requests it sent there. The simulator and the emulated fleet fill
    every field with the same meaning (``sim/engine/instance.py``).

    - ``waiting``: ``vllm:num_requests_waiting`` — queued, no prefill chunk scheduled yet (vLLM
      V1: a request leaves *waiting* when its first chunk is scheduled, not when KV fits);
    - ``running``: ``vllm:num_requests_running`` — scheduled (prefilling or decoding);
    - ``tokens_in_flight``: the dispatcher's count over the requests sent there and not ended,
      however they reached it: prompt tokens plus output tokens streamed so far of those it
      runs; the prompt tokens of those a gateway runs (from their decision to their completion,
      ``dispatcher/elsewhere.py``: their output is not on the log until they end);
    - ``kv_blocks_used``: ``vllm:kv_cache_usage_perc`` * ``kv_blocks_total``;
    - ``kv_blocks_total``: the engine's KV capacity (``num_gpu_blocks`` * block size / 512);
    - ``prefix_cache_queries`` / ``prefix_cache_hits``: ``vllm:prefix_cache_queries_total`` /
      ``vllm:prefix_cache_hits_total`` (prompt tokens looked up / found, cumulative);
    - ``preemptions``: ``vllm:num_preemptions_total`` (cumulative);
    - ``endpoint_ready``: the engine's ``/health`` answers 200; ``model`` / ``model_version`` /
      ``profile`` / ``dc``: the deployment that started it;
    - ``gpus`` / ``price_per_hour``: what the instance holds and what an hour of it costs (the
      engine profile's or the inventory's price; None: no price, cost figures report GPU-seconds);
    - ``draining``: the instance is being removed (a plan on ``tf.plans`` shrank its pool): no
      decider sends it anything new, and what it runs finishes before it stops;
    - ``role``: its part in prefill/decode disaggregation, from its deployment: ``prefill`` (it
      only prefills requests another instance decodes), ``decode`` or ``both`` (the default);
    - ``kv_bytes_per_token``: the bytes of KV cache one prompt token takes on it (what moving a
      prompt's cache to another instance sends per token; 0: not known);
    - ``kv_block_tokens``: the engine's own KV block size in tokens (vLLM's ``block_size``; what
      a running request's cache is allocated in; 0: not known);
    - ``max_seqs`` / ``prefill_budget_tokens``: its scheduler's limits, from its deployment: the
      requests it runs at once (vLLM's ``--max-num-seqs``) and the tokens one step computes
      (``--max-num-batched-tokens``); 0: not known.
    """

    instance_id: Name
    dc: Label
    model: Label
    model_version: Label
    profile: Label = ""
    endpoint_ready: bool = True
    waiting: Count
    running: Count
    tokens_in_flight: Count
    kv_blocks_used: Count
    kv_blocks_total: int = Field(ge=1, le=MAX_COUNT)
    prefix_cache_queries: Total = 0
    prefix_cache_hits: Total = 0
    preemptions: Total = 0
    gpus: int = Field(default=1, ge=1, le=1024)
    price_per_hour: float | None = Field(default=None, ge=0, lt=1e6)
    draining: bool = False
    role: Role = "both"
    kv_bytes_per_token: Count = 0
    kv_block_tokens: Count = 0
    max_seqs: Count = 0
    prefill_budget_tokens: Count = 0


class KvEvent(Event):
    """Blocks stored in or removed from one instance's prefix cache."""

    instance_id: Name
    model: Label
    kind: Literal["stored", "removed"]
    block_hashes: BlockHashes


class ResponseStarted(Event):
    """The first token of one request attempt left its instance (what a proxy sees first).

    With ``prefill_leg`` the event is not the client's first token: the prefill leg of a
    disaggregated request ended on ``instance_id`` (its prefill instance), ``ttft_s`` after the
    request's arrival (the same clock as a first token); its KV cache then moves to the decode
    instance, whose first token, the client's, comes later as an ordinary ``ResponseStarted``.
    A request whose prefill fell back to its decode instance (local prefill) has no such event."""

    request_id: Name
    attempt: Attempt = 1
    instance_id: Label
    model: Label
    ttft_s: Duration = Field(description="arrival at the scheduler -> this first token")
    prefill_leg: bool = Field(
        default=False, description="the end of a disaggregated request's prefill leg, not its first token"
    )


class Completion(Event):
    """The end of one request attempt on an instance."""

    request_id: Name
    attempt: Attempt = 1
    instance_id: Label
    model: Label
    tenant: Label = "default"
    slo_class: Label = "interactive"
    status: Literal["ok", "timeout", "aborted", "error"]
    arrival_ts: Timestamp = Field(description="when the request reached the scheduler")
    ttft_s: Duration | None = None
    tpot_s: Duration | None = None
    e2e_s: Duration | None = None
    input_tokens: int = Field(ge=0, le=MAX_TOKENS)
    cached_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    output_tokens: int = Field(ge=0, le=MAX_TOKENS)
    deadline_ts: Timestamp | None = None


class Response(Event):
    """The answer to one request attempt, on ``tf.responses`` keyed by request id: what the
    engine generated (``text``), why it stopped (``finish_reason``: ``stop``, ``length``, ...)
    and the usage the engine reported; ``status`` as in its ``Completion`` (``error`` says why)."""

    request_id: Name
    attempt: Attempt = 1
    instance_id: Label
    model: Label
    status: Literal["ok", "timeout", "aborted", "error"]
    text: str = Field(default="", max_length=MAX_RESPONSE_CHARS)
    finish_reason: Label | None = None
    prompt_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    completion_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    cached_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    error: Reason = ""


class AdmissionDecision(Event):
    """The admission stage's answer: admit now, hold in ``queue_pool``, or reject, with the
    reason (its code first, e.g. ``cannot_meet_slo: ...``), the predicted TTFT it was based on
    (if the stage predicts one) and, for a reject, ``retry_after_s``: when trying again could
    succeed (None: no hint). ``affinity_key``: the request's (``InferenceRequest.affinity_key``),
    so a decision lands on the same partition number as the request it settles."""

    request_id: Label
    attempt: Attempt = 1
    tenant: Label = "default"
    model: Label
    slo_class: Label
    action: Literal["admit", "queue", "reject"]
    reason: Reason = ""
    policy: Label
    queue_pool: Label = ""
    predicted_ttft_s: Prediction | None = None
    retry_after_s: Prediction | None = None
    affinity_key: str = Field(default="", max_length=2 * MAX_NAME_LENGTH + 32)
    scheduler: Label = Field(default="", description="the scheduler that decided (its deciders' group)")
    worker: Label = Field(default="", description="the scheduler worker that decided (host:pid)")
    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS, description="the request's prompt tokens")


class RoutingDecision(Event):
    """Where a request runs: data centre and instance, with the prediction it was based on.

    ``prefill_instance_id``: the instance of the same DC that prefills it first, its KV cache
    then moved to ``instance_id``, which decodes it (prefill/decode disaggregation); empty: it
    runs whole on ``instance_id``. Its answer, first token and end are ``instance_id``'s either way.
    """

    request_id: Label
    attempt: Attempt = 1
    tenant: Label = "default"
    model: Label
    slo_class: Label
    dc: Label
    instance_id: Label
    policy: Label
    reason: Reason = ""
    predicted_ttft_s: Prediction | None = None
    decision_latency_s: Duration = Field(description="time the policy spent on it, seconds")
    worker: Label = Field(default="", description="the scheduler worker that decided (host:pid)")
    scheduler: Label = Field(default="", description="the scheduler that decided (its deciders' group)")
    prefill_instance_id: Label = Field(
        default="", description="the instance that prefills it first; empty = whole"
    )
    request: InferenceRequest

    @property
    def affinity_key(self) -> str:
        return self.request.affinity_key


class DeadLetter(Event):
    """An input that could not be processed: the original bytes (base64) and why.

    ``reason`` is cut to ``MAX_REASON_LENGTH`` rather than rejected (it can quote a field name
    the bad input chose, and a dead letter must never fail). The original is kept whole up to
    ``MAX_DEAD_LETTER_ORIGINAL`` bytes, else its first bytes (``truncated``); ``original_size``
    and ``original_sha256`` always describe the whole original, so it can be found and matched.
    """

    source_topic: Label
    reason: Reason
    original_b64: str
    original_key_b64: str | None = None
    original_size: int = Field(default=0, ge=0)
    original_sha256: str = ""
    truncated: bool = False

    @field_validator("reason", mode="before")
    @classmethod
    def _cut(cls, value: object) -> object:
        if isinstance(value, str) and len(value) > MAX_REASON_LENGTH:
            return value[: MAX_REASON_LENGTH - 3] + "..."
        return value


class FleetEvent(Event):
    """What FleetMind (the DC-selection stage) tells operators, on ``tf.fleet-events`` keyed by
    model pool: ``kind`` happened to ``dc`` for ``model`` at ``model_version`` (``ts``: when
    the scheduler saw it).

    - ``dc_down`` / ``dc_recovering`` / ``dc_up``: the DC's serving state for the model version
      changed (down: no ready instance with a fresh heartbeat; recovering: traffic returns
      gradually);
    - ``reservation_moved``: ``tenant``'s reservation is now booked in ``dc`` ("" = nowhere);
    - ``replica_advice``: add (``delta`` +1) or remove (-1) an instance of the version in ``dc``,
      which makes ``replicas`` instances of it there (the target an autoscaler converges to).

    ``detail`` says why, in words, with the figures it was based on; ``worker``: the scheduler
    worker that saw it (host:pid).
    """

    kind: Literal["dc_down", "dc_recovering", "dc_up", "reservation_moved", "replica_advice"]
    dc: Label
    model: Name
    model_version: Label = ""
    detail: Reason = ""
    delta: int = Field(default=0, ge=-MAX_COUNT, le=MAX_COUNT)
    tenant: Label = ""
    worker: Label = ""
    replicas: int | None = Field(default=None, ge=0, le=MAX_COUNT)


class ReplicaPlan(Event):
    """A planner's desired shape of one pool, on ``tf.plans`` keyed by model: ``replicas``
    replicas of ``model`` at ``model_version`` in ``dc`` (ready and loading; the rest drain),
    ``warm``: the models whose weights ``dc`` should keep staged (None: unchanged), ``reason``
    in words with the figures it was based on. ``planner``: which planner (``static``, ``hpa``,
    ``dynamo-sla``, ``fleetmind``) and ``worker``: the process that published it (host:pid).
    ``prefill_replicas``: of the ``replicas``, how many run prefill only (role ``prefill``; the
    rest ``both``; more than ``replicas`` means all of them); None: the pool keeps the prefill
    replicas it runs.
    """

    planner: Label
    model: Name
    model_version: Label = ""
    dc: Label
    replicas: int = Field(ge=0, le=MAX_COUNT)
    prefill_replicas: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    warm: tuple[Label, ...] | None = Field(default=None, max_length=1024)
    reason: Reason = ""
    worker: Label = ""


class DeciderAnnouncement(Event):
    """A decider of the deciders' group ``scheduler`` says where gateways may ask it directly
    (``address``, host:port of its direct lane, ``streams/direct.py``) and which partitions of
    ``tf.requests`` Kafka's group gave it (``partitions``, of ``partition_count``). Sent on
    ``tf.deciders`` when its assignment changes and every few seconds while it lives (a gateway
    forgets a decider not heard for a while); ``leaving``: it stops now."""

    worker: Label
    scheduler: Label = ""
    address: Label
    partitions: tuple[Annotated[int, Field(ge=0, le=MAX_PARTITIONS)], ...] = Field(
        default=(), max_length=MAX_PARTITIONS
    )
    partition_count: int = Field(default=0, ge=0, le=MAX_PARTITIONS)
    leaving: bool = False


EVENT_TYPES: tuple[type[Event], ...] = (
    InferenceRequest,
    BatchJob,
    Heartbeat,
    KvEvent,
    ResponseStarted,
    Completion,
    AdmissionDecision,
    RoutingDecision,
    Response,
    DeadLetter,
    FleetEvent,
    DeciderAnnouncement,
    ReplicaPlan,
)
