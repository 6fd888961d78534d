"""The ``ideal`` bounds: latency floors no router can beat on this workload and hardware.

Every request is served alone on an idle instance of the fleet's fastest profile (for it) that
already holds every prompt block any earlier request carried (``ideal``: unlimited cache, no
queueing, no batching, no client give-ups: the strict floor), or every block still in one
least-recently-used cache as large as the whole fleet's KV memory (``ideal-fleet-cache``: no
queueing, and a cache of the fleet's size; *not* a strict floor per request: one pooled LRU
evicts blocks that separate per-instance caches may keep, so some requests of a real policy
beat it). Its prefill runs in budget-sized chunks at the step-time law, then it decodes alone
(batch of one). On a profile with step-time noise the bounds use the law's mean (noise 1), so
they are floors in expectation, not for each request. Reported like a policy, so each
policy's distance from the floor is visible.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.engine.profiles import EngineProfile
from sim.workloads.trace import TraceRequest, Workload


def _served_alone(profile: EngineProfile, input_tokens: int, cached: int, output: int) -> tuple[float, float]:
    """(TTFT, time from first to last token) of one request alone on an idle instance."""
    ttft = 0.0
    context = cached
    while context < input_tokens:
        chunk = min(input_tokens - context, profile.prefill_budget_tokens)
        ttft += profile.t0_s + profile.prefill_chunk_s(chunk, context)
        context += chunk
    steps = output - 1
    decode = profile.decode_alone_s(input_tokens, steps)
    return ttft, decode


def ideal_attempts(
    workload: Workload,
    fleet: FleetSpec,
    budget_for: Callable[[TraceRequest], int],
    window_end: float,
    cache_blocks: int | None = None,
) -> list[Attempt]:
    """One completed attempt per request, timed as the bound describes; ``cache_blocks`` bounds
    the pooled LRU cache (None: unlimited)."""
    profiles = {spec.profile.name: spec.profile for spec in fleet.instances}.values()
    seen: OrderedDict[int, None] = OrderedDict()
    attempts = []
    for request in workload.requests:
        matched = 0
        for block in request.block_hashes:
            if block not in seen:
                break
            matched += 1
        cached = min(request.reusable_tokens(matched), request.input_tokens - 1)
        for block in request.block_hashes:
            seen[block] = None
            seen.move_to_end(block)
        while cache_blocks is not None and len(seen) > cache_blocks:
            seen.popitem(last=False)
        attempt = Attempt(request, 1, request.arrival_s, budget_for(request))
        ttft, decode = min(
            _served_alone(p, request.input_tokens, cached, attempt.target_tokens) for p in profiles
        )
        attempt.admitted_s = request.arrival_s
        attempt.cached_tokens = cached
        attempt.generated = attempt.target_tokens
        attempt.first_token_s = request.arrival_s + ttft
        attempt.end_s = attempt.first_token_s + decode
        attempt.status = "ok"
        if attempt.first_token_s < window_end < attempt.end_s:
            # Running at the window's close: tokens so far, at a near-constant decode rate.
            share = (window_end - attempt.first_token_s) / (attempt.end_s - attempt.first_token_s)
            attempt.tokens_in_window = 1 + int(share * (attempt.generated - 1))
        attempts.append(attempt)
    return attempts
