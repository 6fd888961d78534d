"""Dynamo's profiling step, run on the engine model: what one replica sustains at the SLO targets.

Dynamo's SLA planner needs, before it runs, a profile of one engine measured on a GPU by its
profiler (ai-dynamo/dynamo ``benchmarks/profiler/utils/profile_prefill.py`` at
65a68a202e5c2ebf5384bdfbea2304626669ff95 and ``benchmarks/profiler/utils/profile_decode.py`` at
d2814ba010c689b883d2e88f7bd670b2d7588b57). Here the same measurements run offline on the
simulator's engine (``sim/engine/instance.py``), deterministic and without a clock:

- Prefill, for input lengths ``100, 100 + step, ...`` below ``max_context - 512`` with
  ``step = (max_context - 100) // granularity`` (Dynamo's grid): the TTFT of one request alone
  on an idle replica, and the prefill throughput ``isl / TTFT`` (tokens/s per replica).
- Decode, for input lengths ``100, 100 + step, ...`` below ``max_context - osl`` with
  ``step = (max_context - osl) // granularity`` and ``osl`` = ``decode_osl`` (Dynamo: 500), at
  context ``isl + osl / 2``: ``n`` requests decode together; the inter-token latency is the time
  per step while all ``n`` decode and none prefills (the prompts are prefilled before, in one
  step, so the decode steps are the engine's own); the decode throughput is ``n / ITL``. ``n``
  is the largest concurrency whose ITL is within the target (found by bisection: the ITL grows
  with ``n``), at most what the KV cache holds without pre-emption, ``max_seqs`` and the token
  budget; Dynamo sweeps a grid of ``n`` and interpolates, which this replaces by an exact search.
  If even one request misses the target, ``n`` = 1 (Dynamo reports its lowest point too).

The result is ``agents/policy/planners/dynamo_sla.py:DynamoProfile``, which the planner is
built with; profiles are cached per engine profile and targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache

from agents.policy.planners.dynamo_sla import DynamoProfile
from agents.policy.types import BLOCK_TOKENS
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.instance import Instance
from sim.engine.profiles import EngineProfile
from sim.workloads.trace import make_request

DECODE_OSL = 500
"""Output tokens of each request of a decode measurement (Dynamo's profiler: 500)."""

PROMPT_ROOM = 512
"""Tokens Dynamo's prefill sweep leaves below the context limit (chat template, system prompt)."""


@lru_cache(maxsize=64)
def profile_engine(
    profile: EngineProfile,
    ttft_s: float,
    itl_s: float,
    max_context: int = 32_768,
    granularity: int = 16,
    decode_osl: int = DECODE_OSL,
) -> DynamoProfile:
    """Dynamo's profile of one replica running ``profile`` (module docstring), against the
    targets ``ttft_s`` and ``itl_s`` (seconds)."""
    if not (ttft_s > 0 and itl_s > 0) or granularity < 2 or max_context <= decode_osl + 100:
        raise ValueError("targets must be > 0, granularity >= 2, max_context > decode_osl + 100")
    isls, ttfts, prefills = [], [], []
    for isl in range(100, max_context - PROMPT_ROOM, max(1, (max_context - 100) // granularity)):
        ttft = prefill_ttft_s(profile, isl)
        isls.append(float(isl))
        ttfts.append(ttft)
        prefills.append(isl / ttft)
    contexts, itls, concurrency, decodes = [], [], [], []
    for isl in range(100, max_context - decode_osl, max(1, (max_context - decode_osl) // granularity)):
        most = max_concurrency(profile, isl, decode_osl)
        if most == 0:
            break  # the KV cache cannot hold one such request (Dynamo stops there too)
        n, itl = _best_concurrency(profile, isl, decode_osl, most, itl_s)
        contexts.append(isl + decode_osl / 2)
        itls.append(itl)
        concurrency.append(n)
        decodes.append(n / itl)
    return DynamoProfile(
        ttft_s=ttft_s,
        itl_s=itl_s,
        prefill_isl=tuple(isls),
        prefill_ttft_s=tuple(ttfts),
        prefill_tokens_per_s=tuple(prefills),
        decode_context=tuple(contexts),
        decode_itl_s=tuple(itls),
        decode_concurrency=tuple(concurrency),
        decode_tokens_per_s=tuple(decodes),
    )


def profiles_for_fleet(
    fleet: FleetSpec, ttft_s: float, itl_s: float
) -> Mapping[tuple[str, str], DynamoProfile]:
    """One profile per ``(model, version)`` the fleet lists, of the engine its first instance runs."""
    engines: dict[tuple[str, str], EngineProfile] = {}
    for spec in fleet.instances:
        engines.setdefault((spec.model, spec.version), spec.profile)
    return {key: profile_engine(engine, ttft_s, itl_s) for key, engine in engines.items()}


def max_concurrency(profile: EngineProfile, isl: int, osl: int) -> int:
    """Requests of ``isl + osl`` tokens one replica holds at once: all their KV blocks resident
    (no pre-emption), at most ``max_seqs``, and one decode token each within the step budget."""
    per_request = -(-(isl + osl) // BLOCK_TOKENS)
    return min(
        (profile.kv_tokens // BLOCK_TOKENS) // per_request, profile.max_seqs, profile.prefill_budget_tokens
    )


def prefill_ttft_s(profile: EngineProfile, isl: int) -> float:
    """TTFT of one request of ``isl`` prompt tokens alone on an idle replica (chunked prefill)."""
    instance = _instance(profile)
    (attempt,) = _attempts(1, isl, 1)
    instance.enqueue(attempt, 0.0)
    while attempt.first_token_s is None:
        instance.finish_step(instance.step_end_s)
    return attempt.first_token_s


def decode_itl_s(profile: EngineProfile, isl: int, osl: int, n: int) -> float:
    """Seconds per decode step of ``n`` requests of ``isl`` prompt tokens decoding together
    (mean over the steps while all ``n`` decode), their prompts prefilled beforehand."""
    # A budget that prefills every prompt at once: the decode steps after it do not depend on
    # it while n decode tokens fit in the original budget (``max_concurrency``).
    engine = replace(profile, prefill_budget_tokens=max(profile.prefill_budget_tokens, n * (isl + 1)))
    instance = _instance(engine)
    attempts = _attempts(n, isl, osl)
    for attempt in attempts:
        instance.enqueue(attempt, 0.0)
    start_s: float | None = None
    generated: dict[int, int] = {}
    while instance.scheduled:
        now = instance.step_end_s
        ended = instance.finish_step(now)
        if start_s is None and all(a.first_token_s is not None for a in attempts):
            start_s = now
            generated = {id(a): a.generated for a in attempts}
        if ended and start_s is not None:
            first = ended[0]
            return (now - start_s) / (first.generated - generated[id(first)])
    raise RuntimeError("the decode measurement ended before every request decoded")


def _best_concurrency(
    profile: EngineProfile, isl: int, osl: int, most: int, itl_s: float
) -> tuple[int, float]:
    """(n, ITL): the largest n in 1..``most`` whose ITL is within ``itl_s`` (else n = 1)."""
    low_itl = decode_itl_s(profile, isl, osl, 1)
    if low_itl > itl_s:
        return 1, low_itl
    low, high = 1, most
    best = low_itl
    while low < high:
        mid = (low + high + 1) // 2
        itl = decode_itl_s(profile, isl, osl, mid)
        if itl <= itl_s:
            low, best = mid, itl
        else:
            high = mid - 1
    return low, best


def _instance(profile: EngineProfile) -> Instance:
    spec = InstanceSpec("profiling", "profiling", "profiling", "", profile)
    return Instance(spec, (0.0, float("inf")), kv_events=False)


def _attempts(n: int, isl: int, osl: int) -> list[Attempt]:
    """``n`` requests with prompts of their own (no shared prefix), generating ``osl`` tokens."""
    return [
        Attempt(make_request(f"profile-{i}", 0.0, isl, osl, None, unique_key=i), 1, 0.0, osl)
        for i in range(n)
    ]


__all__ = [
    "DECODE_OSL",
    "decode_itl_s",
    "max_concurrency",
    "prefill_ttft_s",
    "profile_engine",
    "profiles_for_fleet",
]
