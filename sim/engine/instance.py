"""One inference engine instance, as vLLM / SGLang behave, in simulated time.

Continuous batching with chunked prefill: every step decodes one token for each running request
whose prompt is done, plus up to ``prefill_budget_tokens`` of prompt chunks (FCFS); at most
``max_seqs`` requests run; a request is admitted (FCFS, head of line blocks) only when its KV
reservation fits; running work is never pre-empted. The last prefill chunk of a request yields
its first output token.

Speed: a run of decode-only steps with a fixed batch is one *macro-step* of k steps, k = steps
until the first running request finishes. Step i of it takes ``alpha + beta*i`` (contexts grow
by one token per step), so its end time is closed-form. Anything that changes the batch (a new
request, an abort) truncates the macro-step to the step in progress; observers (heartbeats)
compute the steps done so far without changing anything.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agents.policy.types import BLOCK_TOKENS
from sim.engine.fleet import InstanceSpec
from sim.engine.kv_cache import PrefixKvCache
from sim.workloads.trace import TraceRequest


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt of a request: what the client sent and what happened to it."""

    request: TraceRequest
    attempt: int
    arrival_s: float
    output_budget: int
    predicted_ttft_s: float | None = None  # the router's prediction, if its policy makes one
    # Filled in by the instance:
    instance: Instance | None = None
    cached_tokens: int = 0
    prefill_left: int = 0
    context: int = 0
    generated: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    tokens_in_window: int | None = None  # set for attempts still running when the window closes
    status: str = "pending"  # pending -> ok | aborted | rejected
    abort_requested: bool = False
    keyed_blocks: list[int] = field(default_factory=list)
    anonymous_blocks: int = 0

    @property
    def target_tokens(self) -> int:
        """Tokens the engine will generate: the true length, capped by the client's budget."""
        return min(self.request.output_tokens, self.output_budget)

    @property
    def reserved_blocks(self) -> int:
        """KV blocks reserved at admission: prompt + the client's output budget. An engine that
        never pre-empts must reserve the cap (it cannot know the true length either)."""
        return -(-(self.request.input_tokens + self.output_budget) // BLOCK_TOKENS)


class Instance:
    """The engine of one instance. The runner calls ``enqueue``, ``abort``, ``finish_step``.

    After any call, if ``scheduled`` is true the instance wants ``finish_step`` called at
    ``step_end_s``; ``version`` changes whenever that time changes (stale events are skipped).
    """

    def __init__(self, spec: InstanceSpec, window: tuple[float, float], kv_events: bool) -> None:
        self.spec = spec
        self.profile = spec.profile
        self.cache = PrefixKvCache(spec.profile.kv_tokens // BLOCK_TOKENS, record_events=kv_events)
        self.waiting: deque[Attempt] = deque()
        self.running: list[Attempt] = []
        self.tokens_in_flight = 0
        self.window = window
        self.busy_s = 0.0
        self.version = 0
        self.scheduled = False
        self.step_start_s = 0.0
        self.step_end_s = 0.0
        self._steps = 1
        self._alpha = 0.0
        self._beta = 0.0
        self._decoders: list[Attempt] = []
        self._chunks: list[tuple[Attempt, int]] = []
        self.first_tokens: list[Attempt] = []  # got their first token since the caller last took them

    # --- inputs -------------------------------------------------------------------------------

    def fits_ever(self, attempt: Attempt) -> bool:
        return attempt.reserved_blocks <= self.cache.capacity

    def enqueue(self, attempt: Attempt, now_s: float) -> None:
        """A routed attempt arrives; it joins the batch at the next step boundary."""
        attempt.instance = self
        self.waiting.append(attempt)
        self.tokens_in_flight += attempt.request.input_tokens
        if self.scheduled:
            self._truncate(now_s)
        else:
            self._plan(now_s)

    def abort(self, attempt: Attempt, now_s: float) -> bool:
        """The client gave up. Waiting: removed now (returns True). Running: at the step end."""
        if attempt in self.running:
            attempt.abort_requested = True
            self._truncate(now_s)
            return False
        self.waiting.remove(attempt)
        self.tokens_in_flight -= attempt.request.input_tokens
        if self.scheduled:
            self._truncate(now_s)  # whoever waited behind it may fit at the next boundary
        return True

    # --- observation --------------------------------------------------------------------------

    def tokens_so_far(self, attempt: Attempt, now_s: float) -> int:
        """Output tokens ``attempt`` (running here) has generated by ``now_s``, mid macro-step."""
        if self.scheduled and not self._chunks and attempt in self._decoders:
            return attempt.generated + self._steps_done(now_s)
        return attempt.generated

    def heartbeat(self, now_s: float) -> tuple[int, int, int, int]:
        """(waiting, running, tokens in flight, KV blocks used) as the engine would report now."""
        tokens = self.tokens_in_flight
        if self.scheduled and not self._chunks:
            tokens += self._steps_done(now_s) * len(self._decoders)
        return len(self.waiting), len(self.running), tokens, self.cache.referenced

    # --- the step loop ------------------------------------------------------------------------

    def finish_step(self, now_s: float) -> list[Attempt]:
        """Apply the step (or macro-step) ending now; return attempts that ended; plan the next."""
        self._account_busy(self.step_start_s, now_s)
        for attempt, chunk in self._chunks:
            attempt.context += chunk
            attempt.prefill_left -= chunk
            if attempt.prefill_left == 0:
                new_blocks = attempt.request.block_hashes[len(attempt.keyed_blocks) :]
                self.cache.commit(new_blocks)
                attempt.keyed_blocks.extend(new_blocks)
                attempt.anonymous_blocks -= len(new_blocks)
                attempt.generated = 1
                attempt.context += 1  # context = prompt + generated tokens from now on
                if not attempt.abort_requested:  # a client that gave up never sees it
                    attempt.first_token_s = now_s
                    self.first_tokens.append(attempt)
                self.tokens_in_flight += 1
        steps = self._steps
        for attempt in self._decoders:
            attempt.generated += steps
            attempt.context += steps
        self.tokens_in_flight += steps * len(self._decoders)

        ended = []
        still_running = []
        for attempt in self.running:
            if attempt.abort_requested:
                attempt.status = "aborted"
            elif attempt.generated >= attempt.target_tokens:
                attempt.status = "ok"
            else:
                still_running.append(attempt)
                continue
            attempt.end_s = now_s
            self._release(attempt)
            ended.append(attempt)
        self.running = still_running
        self.scheduled = False
        self._plan(now_s)
        return ended

    def _release(self, attempt: Attempt) -> None:
        self.cache.release(attempt.keyed_blocks, attempt.anonymous_blocks)
        self.tokens_in_flight -= attempt.request.input_tokens + attempt.generated

    def _admit(self, now_s: float) -> None:
        """Move waiting attempts into the batch, FCFS, while seats and KV reservations allow."""
        while self.waiting and len(self.running) < self.profile.max_seqs:
            attempt = self.waiting[0]
            blocks = attempt.request.block_hashes
            matched = self.cache.acquire(blocks, attempt.reserved_blocks)
            if matched is None:
                return
            self.waiting.popleft()
            input_tokens = attempt.request.input_tokens
            # A fully cached prompt still recomputes its last token to produce logits.
            cached = min(matched * BLOCK_TOKENS, input_tokens - 1)
            attempt.admitted_s = now_s
            attempt.cached_tokens = cached
            attempt.context = cached
            attempt.prefill_left = input_tokens - cached
            attempt.keyed_blocks = list(blocks[:matched])
            attempt.anonymous_blocks = attempt.reserved_blocks - matched
            self.running.append(attempt)

    def _plan(self, now_s: float) -> None:
        """Form the next step at a step boundary (or on an idle instance) and schedule it."""
        self._admit(now_s)
        if not self.running:
            self._chunks, self._decoders = [], []
            return
        profile = self.profile
        decoders = [a for a in self.running if a.prefill_left == 0]
        decode_context = sum(a.context for a in decoders)
        chunks = []
        budget = profile.prefill_budget_tokens
        prefill_s = 0.0
        for attempt in self.running:
            if budget == 0:
                break
            if attempt.prefill_left > 0:
                chunk = min(attempt.prefill_left, budget)
                budget -= chunk
                chunks.append((attempt, chunk))
                prefill_s += profile.prefill_chunk_s(chunk, attempt.context)
        self._alpha = (
            profile.t0_s
            + prefill_s
            + profile.decode_s_per_seq * len(decoders)
            + profile.decode_s_per_context_token * decode_context
        )
        if chunks:
            self._steps, self._beta = 1, 0.0
        else:
            self._steps = min(a.target_tokens - a.generated for a in decoders)
            self._beta = profile.decode_s_per_context_token * len(decoders)
        self._chunks, self._decoders = chunks, decoders
        self.step_start_s = now_s
        self.step_end_s = now_s + self._elapsed(self._steps)
        self.scheduled = True
        self.version += 1

    def _elapsed(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of the current macro-step."""
        return steps * self._alpha + self._beta * steps * (steps - 1) / 2

    def _steps_done(self, now_s: float) -> int:
        """Steps of the current macro-step completed by ``now_s`` (0..steps)."""
        elapsed = now_s - self.step_start_s
        if elapsed <= 0:
            return 0
        alpha, beta = self._alpha, self._beta
        if beta == 0:
            done = int(elapsed / alpha)
        else:
            half = alpha - beta / 2
            done = int((-half + math.sqrt(half * half + 2 * beta * elapsed)) / beta)
        done = max(0, min(done, self._steps))
        # Guard the float solution at the edges.
        while done > 0 and self._elapsed(done) > elapsed:
            done -= 1
        while done < self._steps and self._elapsed(done + 1) <= elapsed:
            done += 1
        return done

    def _truncate(self, now_s: float) -> None:
        """End the current macro-step after the step in progress, so the batch can change."""
        if self._steps <= 1:
            return
        done = self._steps_done(now_s)
        on_boundary = done > 0 and self._elapsed(done) == now_s - self.step_start_s
        keep = done if on_boundary else min(done + 1, self._steps)
        if keep < self._steps:
            self._steps = keep
            self.step_end_s = self.step_start_s + self._elapsed(keep)
            self.version += 1

    def _account_busy(self, start_s: float, end_s: float) -> None:
        lo, hi = max(start_s, self.window[0]), min(end_s, self.window[1])
        if hi > lo:
            self.busy_s += hi - lo
