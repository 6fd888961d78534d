"""The engine port: what the dispatcher needs from the inference endpoints behind it.

One object stands for a set of endpoints (instances) and is driven by one asyncio task, the
dispatcher (``dispatcher.service``). Implementations: ``dispatcher.engines.emulated`` (the
simulator's engine model in scaled wall time); a real engine adapter (vLLM over HTTP) keeps the
same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas.events import Completion, Heartbeat, KvEvent, Response, ResponseStarted, RoutingDecision

EngineEvent = ResponseStarted | Completion | Response | KvEvent


class EngineError(RuntimeError):
    """The engines as a whole cannot be used (closed, or the backend is gone for good).

    Never raised for one request or one endpoint: those failures are reported as events (an
    ``error`` completion) and as load (``endpoint_ready=False``).
    """


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One inference endpoint (instance) behind the port, as routing decisions name it."""

    instance_id: str
    dc: str
    model: str  # the model pool it serves
    model_version: str
    profile: str = ""  # hardware / engine profile name, informational


class EnginePort(Protocol):
    """Inference endpoints, as the dispatcher drives them.

    Calling convention: one task calls the methods, one at a time (no concurrent calls).
    ``now_wall`` is the caller's clock, seconds since the epoch (``time.time()``); it never goes
    backwards from one call to the next. An adapter over real engines uses it to stamp what it
    reports and to decide whether a poll or scrape is due; the emulated engines run to it.

    Units: event timestamps (``ts``) are wall seconds since the epoch; durations in events
    (``ttft_s``, ``tpot_s``, ``e2e_s``) are the engines' seconds, counted from the request's
    arrival at the scheduler (its ``ts``); the emulated engines report emulated seconds, which
    at speed X pass X times faster than the clock. KV blocks hold ``BLOCK_TOKENS`` (512) tokens;
    block hashes are the chained prompt hashes of ``InferenceRequest.prompt_block_hashes``.

    What comes back for one dispatched attempt, through ``events``: at most one
    ``ResponseStarted`` with ``prefill_leg`` (a disaggregated attempt's prefill ended on the
    decision's prefill instance), at most one ``ResponseStarted`` (its first token reached the
    client), then exactly one ``Completion``
    (``ok``; ``timeout``: the client gave up waiting; ``aborted``: ``abort`` was called;
    ``error``: the endpoint is unknown, refused it or failed), and one ``Response`` just before
    the ``Completion``: the answer (the text, from engines that generate it; none from the
    emulated ones), which the dispatcher publishes to ``tf.responses`` and keeps. ``KvEvent``s come as the
    endpoints' caches change, whichever request caused it.

    Raises: only ``EngineError`` (any method, once the engines as a whole are unusable, e.g.
    after ``close``); anything else is a bug. ``close`` never raises.
    """

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        """The endpoints behind the port now, in ``load``'s order: fixed for the port's
        lifetime, but for an adapter that follows its inventory file (the vLLM one with a
        ``source``), whose endpoints change between calls as the file does."""
        ...

    @property
    def open_requests(self) -> int:
        """Attempts dispatched whose ``Completion`` has not been returned by ``events`` yet."""
        ...

    async def dispatch(self, decision: RoutingDecision, now_wall: float) -> bool:
        """Start ``decision.request`` on ``decision.instance_id``; return once it is handed over
        (never waits for tokens). Its outcome comes back through ``events``, also when it cannot
        run (unknown endpoint, prompt too long, past its client timeout already: a completion).

        Returns False, doing nothing and reporting nothing, for a decision about an attempt
        dispatched before (same request id and attempt, whatever its ``event_id``): the bus
        delivers at least once, and a request never runs twice.
        """
        ...

    async def abort(self, request_id: str, attempt: int, now_wall: float) -> bool:
        """The client hung up on attempt ``attempt`` of ``request_id``: stop generating for it.
        Its completion follows through ``events``, normally ``aborted`` (one that finished
        meanwhile keeps its own status). Returns False, doing nothing, when no such attempt is
        open (never dispatched, or already ended or being given up on)."""
        ...

    async def load(self, now_wall: float) -> list[Heartbeat]:
        """Each endpoint's load and cache state, one ``Heartbeat`` per endpoint in ``endpoints``
        order: waiting and running requests, tokens in flight, KV blocks used / total, readiness
        (``endpoint_ready``; False: it cannot take requests or could not be read), model
        version, ``draining`` (being removed: nothing new for it). ``ts`` is when it was read
        (an adapter may return its last scrape)."""
        ...

    async def events(self, now_wall: float) -> list[EngineEvent]:
        """Everything produced since the last call, up to ``now_wall``, in time order (``ts``
        non-decreasing); each event is returned once."""
        ...

    def next_wakeup(self, now_wall: float) -> float | None:
        """Wall time (>= ``now_wall``) by which ``events`` next has something, so the caller may
        sleep until then; None: nothing until the next ``dispatch`` or ``abort``. An adapter
        whose events arrive on their own returns ``now_wall`` plus a short poll interval."""
        ...

    async def close(self) -> None:
        """Release connections and stop generating for attempts still open (they are not
        reported). Idempotent; every other method raises ``EngineError`` afterwards."""
        ...
