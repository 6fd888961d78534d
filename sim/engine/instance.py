"""One inference engine instance, as vLLM V1 behaves, in simulated time.

The scheduler follows vLLM V1's ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``,
vllm-project/vllm commit 00024d314514900f361ad072af6931e403b7f589) and its KV cache manager
(``vllm/v1/core/kv_cache_manager.py``, commit 003df2961dd8830c317a61f9745ccd557da9fa06). The
departures from vLLM that ``EngineOptions`` (``sim/engine/profiles.py``) can switch on are named
where they apply; the defaults are vLLM's behaviour.

One step (continuous batching, chunked prefill):
- Token budget: ``prefill_budget_tokens`` is vLLM's ``max_num_batched_tokens``. RUNNING requests
  are scheduled first, in the order they were scheduled from the queue: a decoding request takes
  1 token of the budget, a partially prefilled one its next chunk (what is left of its prompt, at
  most what is left of the budget); when the budget is spent the rest of the running list sits
  this step out. Then WAITING requests, FCFS: each gets a first chunk of what is left of the
  budget, while ``len(running) < max_seqs`` (``max_num_seqs``) and its KV blocks can be
  allocated; the first one that cannot be blocks the queue (head of line). No waiting request is
  scheduled in a step that pre-empted (vLLM's ``if not preempted_reqs``). Option
  ``decode_tokens_in_budget=False``: decodes are free and the budget is prefill-only.
- Waiting and running are vLLM's ``num_requests_waiting`` / ``num_requests_running``: a request
  is waiting from ``enqueue`` until its FIRST chunk is scheduled (or, pre-empted, until it is
  scheduled again); running from then until it ends, whether or not the budget reached it in the
  current step.
- KV blocks (``kv_allocation="on-demand"``, vLLM's paged ``allocate_slots``): a request holds
  blocks for the tokens computed so far plus those scheduled this step, so it gets blocks for each
  prompt chunk as it is scheduled and one more block whenever its output crosses a block boundary.
  The resident prefix of its prompt is reused (reference-counted), and each full prompt block
  becomes shareable as soon as its chunk is computed. Blocks are the engine's own
  (``EngineProfile.kv_block_tokens``, vLLM's ``block_size``; ``_blocks`` converts tokens to them,
  the one place that does); reuse is in 512-token prefix blocks (the prompt hashes' granularity),
  ``512 / kv_block_tokens`` engine blocks each (``PrefixKvCache.block_units``). If a running
  request needs a block and none is free, the NEWEST running request is pre-empted by RECOMPUTE
  (vLLM's ``self.running.pop()`` under FCFS), repeatedly, until the block fits or the request
  pre-empted itself: the victim frees every block (its prompt blocks stay cached, evictable), goes
  back to the FRONT of the waiting queue and keeps its generated tokens; when scheduled again it
  prefills prompt + generated tokens as a new prompt (its resident prompt prefix matches again),
  and the last chunk of that prefill yields its next token (no second first token).
  ``preemptions`` counts them (``vllm:num_preemptions_total``). Option
  ``kv_allocation="reserve"``: prompt + output budget is reserved when the request is first
  scheduled and it is never pre-empted. Option ``admission="kv-fits"`` (with "reserve"; the
  simulator's older model): a request leaves the queue, reservation taken, as soon as it fits,
  whether or not the budget reaches it.
- Prefix-cache counters (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, tokens,
  cumulative): counted when a request is scheduled from the queue, queries = its tokens
  (prompt, + generated if resumed), hits = the resident prefix in whole prefix blocks, at most
  ``tokens - 1`` rounded down to a block (vLLM's ``max_cache_hit_length``). As vLLM's
  ``PrefixCacheStats.record`` does, a resumed (pre-empted) request counts in
  ``preempted_prefix_cache_queries`` / ``..._hits`` instead. (The step time itself only
  recomputes the last token of a fully cached prompt, where vLLM recomputes its last block.)
- The last prefill chunk of a request yields its first output token.

Speed: a run of decode-only steps with a fixed batch is one *macro-step* of k steps, k = steps
until the first scheduled request finishes. Step i of it takes ``f*(alpha + beta*i + gamma*i^2)``
(contexts grow by one token per step; gamma is nonzero only for the perturbed law; f is the noise
factor of the macro-step, 1 without noise), so its end time is closed-form. On demand, the
blocks its growth needs are counted in closed form too: k is cut to the last step whose growth
still fits in the free blocks (so the step that would need a missing block is planned afresh, and
pre-empts), and the blocks are taken when the macro-step ends (nothing else allocates meanwhile).
A step that pre-empted is one step: the next one schedules the queue again. Anything that changes
the batch (a new request, an abort) truncates the macro-step to the step in progress; observers
(heartbeats) compute the steps done and the blocks grown so far without changing anything.

What the client sees: every token of an attempt reaches its client the profile's
``token_delay_s`` after the step that made it (``sim/engine/profiles.py``). The engine adds it
to the attempt's way back (``Attempt.return_s``) when the attempt arrives (``enqueue``; with
``token_delay_sigma`` > 0, times a lognormal factor of the attempt's own), so the
drivers (``sim/loop/lifecycle.py``), which date a first token and an end ``return_s`` after the
step, apply it to both: TTFT and E2E include it, TPOT does not, and a session's next call waits
for it.

Noise (profiles with ``noise_sigma`` > 0): one lognormal factor f (mean 1) per planned step or
macro-step, from a per-instance generator seeded from the instance id and
``EngineOptions.noise_seed`` (reproducible). One factor per macro-step keeps every step of it on
the closed form (truncation keeps the factor), so the closed form stays exact; the price is that
noise is correlated over a macro-step (like clock or interference drift), not independent per
step.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections import deque

from agents.policy.types import BLOCK_TOKENS
from sim.engine.attempt import Attempt
from sim.engine.fleet import InstanceSpec
from sim.engine.kv_cache import PrefixKvCache
from sim.engine.profiles import EngineOptions, noise_seed

DELAY_SEED = 0x5DE1A7
"""Mixed into an instance's noise seed for its delay's generator (one of its own, so that the
steps' noise draws the same with or without the delay's)."""


class Instance:
    """The engine of one instance. The runner calls ``enqueue``, ``abort``, ``finish_step``.

    After any call, if ``scheduled`` is true the instance wants ``finish_step`` called at
    ``step_end_s``; ``version`` changes whenever that time changes (stale events are skipped).
    ``options`` overrides the profile's ``EngineOptions``.
    """

    def __init__(
        self,
        spec: InstanceSpec,
        window: tuple[float, float],
        kv_events: bool,
        options: EngineOptions | None = None,
    ) -> None:
        self.spec = spec
        self.profile = profile = spec.profile
        self.options = options if options is not None else profile.options
        self._on_demand = self.options.kv_allocation == "on-demand"
        self._decode_budget = self.options.decode_tokens_in_budget
        self._admit_early = self.options.admission == "kv-fits"
        unit = self._unit = profile.kv_block_tokens
        self.cache = PrefixKvCache(profile.kv_tokens // unit, kv_events, BLOCK_TOKENS // unit)
        self.kv_blocks_total = profile.kv_tokens // BLOCK_TOKENS  # in 512-token blocks, as heartbeats report
        self.waiting: deque[Attempt] = deque()
        self.running: list[Attempt] = []
        self.tokens_in_flight = 0
        self.window = window
        self.busy_s = 0.0
        self.version = 0
        self.scheduled = False
        self.step_start_s = 0.0
        self.step_end_s = 0.0
        # Counters as vLLM's /metrics exports them (cumulative).
        self.preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.preempted_prefix_cache_queries = 0
        self.preempted_prefix_cache_hits = 0
        self._steps = 1
        self._alpha = 0.0
        self._beta = 0.0
        self._gamma = 0.0
        self._noise = 1.0
        seed = noise_seed(spec.instance_id, profile, self.options)
        self._rng = random.Random(seed) if profile.noise_sigma > 0 else None
        self._delay_rng = random.Random(seed ^ DELAY_SEED) if profile.token_delay_sigma > 0 else None
        self._decoders: list[Attempt] = []
        self._chunks: list[tuple[Attempt, int]] = []
        self._growth_starts: list[int] | None = None  # sorted first growth step of each decoder
        self.first_tokens: list[Attempt] = []  # got their first token since the caller last took them

    # --- inputs -------------------------------------------------------------------------------

    def fits_ever(self, attempt: Attempt) -> bool:
        """Prompt + output budget fit in the whole cache (vLLM refuses what exceeds its
        ``max_model_len``, which it checks fits in the KV cache at start-up)."""
        return self._reserved(attempt) <= self.cache.capacity

    def enqueue(self, attempt: Attempt, now_s: float) -> None:
        """A routed attempt arrives; it joins the batch at the next step boundary. Its way back
        grows by the profile's ``token_delay_s``, times a noise factor if the profile has one
        (module docstring)."""
        attempt.instance = self
        profile = self.profile
        delay = profile.token_delay_s
        if self._delay_rng is not None:
            delay *= self._delay_rng.lognormvariate(profile.token_delay_mu, profile.token_delay_sigma)
        attempt.return_s += delay
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
        self.tokens_in_flight -= attempt.request.input_tokens + attempt.generated  # pre-empted: > 0
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
        """(waiting, running, tokens in flight, KV blocks used) as the engine would report now.

        KV blocks are 512-token blocks out of ``kv_blocks_total``, as the vLLM adapter reports
        them: round(usage * kv_blocks_total), usage = the engine blocks referenced / capacity."""
        tokens = self.tokens_in_flight
        used = self.cache.referenced
        if self.scheduled and not self._chunks:
            done = self._steps_done(now_s)
            tokens += done * len(self._decoders)
            started = min(done, self._steps - 1)  # the step in progress holds its blocks already
            if self._on_demand and started > 0:
                used += self._blocks_grown(started)
        used = round(used * self.kv_blocks_total / self.cache.capacity) if self.cache.capacity else 0
        return len(self.waiting), len(self.running), tokens, used

    # --- the step loop ------------------------------------------------------------------------

    def finish_step(self, now_s: float) -> list[Attempt]:
        """Apply the step (or macro-step) ending now; return attempts that ended; plan the next."""
        self._account_busy(self.step_start_s, now_s)
        on_demand = self._on_demand
        cache = self.cache
        for attempt, chunk in self._chunks:
            attempt.context += chunk
            attempt.prefill_left -= chunk
            if on_demand or attempt.prefill_left == 0:
                hashes = attempt.request.block_hashes
                have = len(attempt.keyed_blocks)
                computed = min(attempt.context // BLOCK_TOKENS, len(hashes)) if on_demand else len(hashes)
                if computed > have:
                    new_blocks = hashes[have:computed]
                    cache.commit(new_blocks)
                    attempt.keyed_blocks.extend(new_blocks)
                    attempt.anonymous_blocks -= len(new_blocks) * cache.block_units
            if attempt.prefill_left == 0:
                attempt.generated += 1  # a resumed request's recompute yields its next token
                attempt.context += 1  # context = prompt + generated tokens from now on
                # A client that gave up never sees it; a resumed request saw it long ago.
                if attempt.first_token_s is None and not attempt.abort_requested:
                    attempt.first_token_s = now_s
                    self.first_tokens.append(attempt)
                self.tokens_in_flight += 1
        steps = self._steps
        if on_demand and steps > 1:
            grown = 0
            for attempt in self._decoders:
                attempt.generated += steps
                context = attempt.context = attempt.context + steps
                need = self._blocks(context - 1)  # the last step wrote token context - 1
                if need > attempt.blocks:
                    grown += need - attempt.blocks
                    attempt.anonymous_blocks += need - attempt.blocks
                    attempt.blocks = need
            if grown:
                cache.allocate(grown)  # fits: the plan cut the macro-step to the free blocks
        else:
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

    def _preempt(self, victim: Attempt) -> None:
        """Recompute pre-emption: free every block, back to the front of the queue."""
        self.cache.release(victim.keyed_blocks, victim.anonymous_blocks)
        victim.keyed_blocks = []
        victim.anonymous_blocks = 0
        victim.blocks = 0
        victim.context = 0
        victim.prefill_left = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _schedule_running(self, budget: int) -> tuple[list[tuple[Attempt, int]], list[Attempt], int, bool]:
        """vLLM's first loop: the running requests, in order, while the budget lasts.

        Returns (prefill chunks, decoders, budget left, whether anyone was pre-empted)."""
        running = self.running
        cache = self.cache
        on_demand = self._on_demand
        decode_budget = self._decode_budget
        chunks: list[tuple[Attempt, int]] = []
        decoders: list[Attempt] = []
        preempted = False
        index = 0
        while index < len(running):
            attempt = running[index]
            left = attempt.prefill_left
            if left > 0:
                if budget == 0:
                    if decode_budget:
                        break
                    index += 1
                    continue
                tokens = left if left < budget else budget
                needed = attempt.context + tokens
            else:
                if decode_budget:
                    if budget == 0:
                        break
                    tokens = 1
                else:
                    tokens = 0
                needed = attempt.context  # the token this step writes is the context's last
            if on_demand and needed > attempt.blocks * self._unit:
                need = self._blocks(needed) - attempt.blocks
                while need > cache.free:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is attempt:
                        break
                if index == len(running):  # it pre-empted itself: nothing else can run
                    break
                cache.allocate(need)
                attempt.blocks += need
                attempt.anonymous_blocks += need
            if left > 0:
                chunks.append((attempt, tokens))
            else:
                decoders.append(attempt)
            budget -= tokens
            index += 1
        return chunks, decoders, budget, preempted

    def _schedule_waiting(self, budget: int, chunks: list[tuple[Attempt, int]], now_s: float) -> None:
        """vLLM's second loop: queued requests, FCFS, head of line blocks."""
        waiting = self.waiting
        running = self.running
        cache = self.cache
        on_demand = self._on_demand
        max_seqs = self.profile.max_seqs
        while waiting and budget > 0 and len(running) < max_seqs:
            attempt = waiting[0]
            request = attempt.request
            tokens = request.input_tokens + attempt.generated  # resumed: recompute the output too
            hashes = request.block_hashes
            matched = cache.match(hashes)
            cached = _computed_ahead(attempt, matched, tokens)
            chunk = min(tokens - cached, budget)
            total = self._blocks(cached + chunk) if on_demand else self._reserved(attempt)
            if cache.acquire(hashes, total, matched) is None:
                return
            waiting.popleft()
            self._start(attempt, tokens, matched, cached, total, now_s)
            chunks.append((attempt, chunk))
            budget -= chunk

    def _admit_when_kv_fits(self, now_s: float) -> None:
        """Option ``admission="kv-fits"`` (older model): move queued attempts into the running
        set, FCFS, while seats and KV reservations allow, whether or not the budget reaches them."""
        waiting = self.waiting
        cache = self.cache
        while waiting and len(self.running) < self.profile.max_seqs:
            attempt = waiting[0]
            request = attempt.request
            tokens = request.input_tokens
            hashes = request.block_hashes
            matched = cache.match(hashes)
            total = self._reserved(attempt)
            if cache.acquire(hashes, total, matched) is None:
                return
            waiting.popleft()
            self._start(attempt, tokens, matched, _computed_ahead(attempt, matched, tokens), total, now_s)

    def _start(
        self, attempt: Attempt, tokens: int, matched: int, cached: int, total: int, now_s: float
    ) -> None:
        """``attempt`` leaves the queue holding ``total`` blocks, the first ``matched`` prefix
        blocks reused."""
        hits = min(matched, (tokens - 1) // BLOCK_TOKENS) * BLOCK_TOKENS
        if attempt.preemptions:
            self.preempted_prefix_cache_queries += tokens
            self.preempted_prefix_cache_hits += hits
        else:
            self.prefix_cache_queries += tokens
            self.prefix_cache_hits += hits
        if attempt.admitted_s is None:
            attempt.admitted_s = now_s
            attempt.cached_tokens = cached
        attempt.context = cached
        attempt.prefill_left = tokens - cached
        attempt.keyed_blocks = list(attempt.request.block_hashes[:matched])
        attempt.anonymous_blocks = total - matched * self.cache.block_units
        attempt.blocks = total
        self.running.append(attempt)

    def _plan(self, now_s: float) -> None:
        """Form the next step at a step boundary (or on an idle instance) and schedule it."""
        self._growth_starts = None
        profile = self.profile
        if self._admit_early:
            self._admit_when_kv_fits(now_s)
        chunks, decoders, budget, preempted = self._schedule_running(profile.prefill_budget_tokens)
        if not preempted and not self._admit_early:
            self._schedule_waiting(budget, chunks, now_s)
        if not chunks and not decoders:
            self._chunks, self._decoders = [], []
            return
        decode_context = 0
        for attempt in decoders:
            decode_context += attempt.context
        prefill_s = 0.0
        for attempt, chunk in chunks:
            prefill_s += profile.prefill_chunk_s(chunk, attempt.context)
        per_context = profile.decode_s_per_context_token
        self._alpha = (
            profile.t0_s + prefill_s + profile.decode_s_per_seq * len(decoders) + per_context * decode_context
        )
        growth = profile.attention_growth_tokens
        if growth > 0:
            self._alpha += per_context * sum(a.context * a.context for a in decoders) / growth
        self._gamma = 0.0
        if chunks or preempted:
            self._steps, self._beta = 1, 0.0
        else:
            self._steps = min(a.target_tokens - a.generated for a in decoders)
            self._beta = per_context * len(decoders)
            if growth > 0:
                self._beta += 2 * per_context * decode_context / growth
                self._gamma = per_context * len(decoders) / growth
            if self._on_demand and self._steps > 1:
                self._steps = self._steps_blocks_allow(decoders, self._steps)
        if self._rng is not None:
            self._noise = self._rng.lognormvariate(profile.noise_mu, profile.noise_sigma)
        self._chunks, self._decoders = chunks, decoders
        self.step_start_s = now_s
        self.step_end_s = now_s + self._elapsed(self._steps)
        self.scheduled = True
        self.version += 1

    def step_end_after(self, now_s: float) -> float | None:
        """When the engine step in progress at ``now_s`` ends (None: idle). A macro-step is many
        decode steps: this is the end of the one ``now_s`` falls in."""
        if not self.scheduled:
            return None
        done = self._steps_done(now_s)
        return min(self.step_start_s + self._elapsed(min(done + 1, self._steps)), self.step_end_s)

    def last_step(self, at_s: float) -> tuple[float, float] | None:
        """(end, length) of the last step of the current macro-step that ended by ``at_s``, if
        one did: what a router reading every streamed token would know at ``at_s``."""
        if not self.scheduled or at_s < self.step_start_s:
            return None
        done = self._steps_done(at_s)
        if done == 0:
            return None
        end = self._elapsed(done)
        return self.step_start_s + end, end - self._elapsed(done - 1)

    def _steps_blocks_allow(self, decoders: list[Attempt], steps: int) -> int:
        """The longest prefix (1..steps) of the macro-step whose block growth fits in the free
        blocks (step 0's blocks are already taken)."""
        free = self.cache.free
        if len(decoders) * ((steps - 2) // self._unit + 1) <= free:
            return steps  # even if every decoder crossed every boundary it could

        def growth(k: int) -> int:
            """Blocks the decoders need for steps 1..k-1 beyond those they hold."""
            total = 0
            for a in decoders:
                extra = self._blocks(a.context + k - 1) - a.blocks
                if extra > 0:
                    total += extra
            return total

        if growth(steps) <= free:
            return steps
        lo, hi = 1, steps  # growth(1) == 0 fits; growth(steps) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if growth(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _blocks_grown(self, last: int) -> int:
        """Blocks the decoders' growth has needed in steps 1..``last`` of the macro-step (vLLM
        takes them when it schedules each step; here when the macro-step ends): decoder j needs
        one at step r_j = u*blocks - context + 1 and every u steps after (u = kv_block_tokens)."""
        unit = self._unit
        starts = self._growth_starts
        if starts is None:
            starts = self._growth_starts = sorted(unit * a.blocks - a.context + 1 for a in self._decoders)
        total = 0
        while last >= 0:
            crossed = bisect_right(starts, last)
            if crossed == 0:
                break
            total += crossed
            last -= unit
        return total

    def _blocks(self, tokens: int) -> int:
        """Engine blocks (``kv_block_tokens`` each) that hold ``tokens`` tokens."""
        return -(-tokens // self._unit)

    def _reserved(self, attempt: Attempt) -> int:
        """Engine blocks of prompt + the client's output budget: the most the sequence may occupy
        (what ``kv_allocation="reserve"`` reserves; the engine cannot know the true length)."""
        return self._blocks(attempt.request.input_tokens + attempt.output_budget)

    def _elapsed(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of the current macro-step."""
        elapsed = steps * self._alpha + self._beta * steps * (steps - 1) / 2
        if self._gamma:
            elapsed += self._gamma * (steps - 1) * steps * (2 * steps - 1) / 6
        return elapsed * self._noise

    def _steps_done(self, now_s: float) -> int:
        """Steps of the current macro-step completed by ``now_s`` (0..steps)."""
        elapsed = now_s - self.step_start_s
        if elapsed <= 0:
            return 0
        if self._gamma:
            lo, hi = 0, self._steps  # the largest k with _elapsed(k) <= elapsed
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._elapsed(mid) <= elapsed:
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        scaled = elapsed / self._noise
        alpha, beta = self._alpha, self._beta
        if beta == 0:
            done = int(scaled / alpha)
        else:
            half = alpha - beta / 2
            done = int((-half + math.sqrt(half * half + 2 * beta * scaled)) / beta)
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
        """Add the step's busy time inside the window to ``busy_s``, and share it among the
        requests in the step by the tokens each computed: a prefill chunk of c tokens counts c,
        a decoder 1 per step of the macro-step. Every busy second goes to some request, so the
        attempts' ``busy_s`` add up to the instance's."""
        lo, hi = max(start_s, self.window[0]), min(end_s, self.window[1])
        if hi <= lo:
            return
        self.busy_s += hi - lo
        steps = self._steps
        tokens = sum(chunk for _, chunk in self._chunks) + steps * len(self._decoders)
        if tokens == 0:
            return
        per_token = (hi - lo) / tokens
        for attempt, chunk in self._chunks:
            attempt.busy_s += chunk * per_token
        for attempt in self._decoders:
            attempt.busy_s += steps * per_token


def _computed_ahead(attempt: Attempt, matched: int, tokens: int) -> int:
    """Tokens of ``attempt``'s ``tokens`` it need not compute: what its resident prefix of
    ``matched`` blocks spares (``TraceRequest.reusable_tokens``), or all of a prompt whose KV a
    prefill instance sent (``kv_received``; a pre-empted one recomputes here). A fully cached
    prompt still computes its last token, for the logits (as vLLM's decode instance does with a
    transferred prompt)."""
    if attempt.kv_received and not attempt.preemptions:
        return tokens - 1
    return min(attempt.request.reusable_tokens(matched), tokens - 1)
