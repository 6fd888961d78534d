"""One emulated instance in wall time: calls in; their tokens, their ends and the cache's changes out.

``EmulatedEngine`` is the simulator's engine model for one instance (``sim.loop.live.LiveFleet``
over a fleet of that one instance, no emulated clients: nobody gives up but a caller that
``abort``s). ``run`` is its driver, one asyncio task: it sleeps until the next step end (or a
call comes or leaves), applies what happened, and while calls stream wakes at least every
``STREAM_INTERVAL_S`` to hand them the tokens generated meanwhile. Each ``Call`` is followed
by its handler through ``Call.changed``. Cache changes go to ``on_cache_changes`` once per
wake-up, then the calls that ended in it go to ``on_call_ended``: a call's blocks are published
before anyone lets go of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.policy.types import BLOCK_TOKENS
from schemas.events import Completion, Heartbeat, InferenceRequest, KvEvent, RoutingDecision
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import EngineProfile
from sim.loop.live import InstanceEvent, LiveFleet

STREAM_INTERVAL_S = 0.02
"""Wall seconds between two hand-outs of streamed tokens: a step's tokens wait at most this long."""

INSTANCE_ID = "emulated"


@dataclass(eq=False)
class Call:
    """One call on the engine, as its handler follows it. ``tokens``: output tokens generated so
    far (never decreases); ``ended``: its completion (``output_tokens``, ``cached_tokens``,
    ``status``) once it ended; ``changed`` is set whenever either changes."""

    key: str  # the engine's own id of the call: unique, whatever request id the caller sent
    prompt_blocks: tuple[int, ...]  # its prompt's block hashes
    tokens: int = 0
    ended: Completion | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class EmulatedEngine:
    """One instance of ``profile`` serving ``model``, ``speed`` times faster than the clock."""

    def __init__(
        self,
        profile: EngineProfile,
        model: str,
        speed: float = 1.0,
        on_cache_changes: Callable[[list[KvEvent]], None] | None = None,
        on_call_ended: Callable[[Call], None] | None = None,
    ) -> None:
        spec = InstanceSpec(INSTANCE_ID, "local", model, "1", profile)
        self._fleet = LiveFleet(FleetSpec(profile.name, (spec,)), speed, slo_classes={})
        self._instance = self._fleet.instances[INSTANCE_ID]
        self._calls: dict[str, Call] = {}
        self._keys = itertools.count()
        self._wake = asyncio.Event()
        self.on_cache_changes = on_cache_changes
        self.on_call_ended = on_call_ended

    @property
    def max_model_len(self) -> int:
        """The most tokens (prompt + ``max_tokens``) one call may hold: the whole KV cache, as vLLM
        refuses a ``max_model_len`` its cache cannot hold."""
        return self._instance.cache.capacity * BLOCK_TOKENS

    def start(self, request: InferenceRequest, output_tokens: int) -> Call:
        """Queue ``request`` (its ``input_tokens`` and ``prompt_block_hashes`` filled, prompt +
        ``output_budget`` within ``max_model_len``); it generates ``output_tokens`` (at most its
        budget) unless aborted."""
        now = time.time()
        call = Call(str(next(self._keys)), request.prompt_block_hashes)
        decision = RoutingDecision(
            request_id=call.key,
            model=request.model,
            slo_class="",
            dc="local",
            instance_id=INSTANCE_ID,
            policy="",
            decision_latency_s=0.0,
            request=request.model_copy(update={"request_id": call.key, "attempt": 1, "ts": now}),
        )
        self._fleet.submit(decision, now, output_tokens)
        self._calls[call.key] = call
        self._wake.set()
        return call

    def abort(self, call: Call) -> None:
        """The caller left: stop generating for ``call`` (it ends ``aborted``; no-op if it ended)."""
        if self._fleet.abort(call.key, 1, time.time()):
            self._wake.set()

    def load(self) -> Heartbeat:
        """The instance's queue, batch, KV use and prefix-cache counters now."""
        (beat,) = self._fleet.heartbeats(time.time())
        self._wake.set()  # reading may have run steps: let the driver hand out what they made
        return beat

    def resident(self, block: int) -> bool:
        """Whether the prefix cache holds ``block`` (a router block hash) now."""
        return self._instance.cache.resident(block)

    async def run(self) -> None:
        """Drive the instance until cancelled."""
        while True:
            self._wake.clear()
            now = time.time()
            self._apply(self._fleet.advance(now), now)
            wake_at = self._fleet.next_wakeup(now)
            if any(call.tokens for call in self._calls.values()):  # streaming: hand out tokens
                wake_at = min(wake_at or math.inf, now + STREAM_INTERVAL_S)
            timeout = None if wake_at is None else max(wake_at - time.time(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _apply(self, events: list[InstanceEvent], now: float) -> None:
        changes = [event for event in events if isinstance(event, KvEvent)]
        if changes and self.on_cache_changes is not None:
            self.on_cache_changes(changes)
        for event in events:
            if isinstance(event, Completion):
                call = self._calls.pop(event.request_id)
                call.ended = event
                call.tokens = event.output_tokens
                call.changed.set()
                if self.on_call_ended is not None:
                    self.on_call_ended(call)
        for call in self._calls.values():
            tokens = self._fleet.tokens_generated(call.key, 1, now)
            if tokens is not None and tokens > call.tokens:
                call.tokens = tokens
                call.changed.set()
