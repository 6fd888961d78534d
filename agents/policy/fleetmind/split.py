"""FleetMind's prefill : decode ratio: how many of a pool's replicas run prefill only.

A ``prefill`` replica runs only the prefill legs of disaggregated requests; the rest of the pool
stays ``both`` (it decodes, and it may still prefill whole when the router finds that sooner, so
a plan never restarts a replica to change the others' role). From the work FleetMind plans by (I
prompt tokens per request, s the share its prefix cache holds, O output tokens, k KV tokens per
running request) and the decode-step law it fits (T0, c, d; a and b, the prefill law's cost per
prompt token and token pair, are the prior's), three rates per replica, in requests/s:

    r(t)  = B / (T0 + B (c + d C))     decode tokens/s of a batch B whose step stays within t,
                                       C = I + O/2, B <= kv_share K / k (its KV must fit)
    p     = a n + b n (s I + n / 2),   n = (1 - s) I: prefill seconds of one request
    decode only   mu_d = r(h tau) / O
    prefill only  mu_p = rho / p,   rho = 2 w / (p + 2 w),  w = h tau_ttft - p
                  (M/D/1: the mean wait rho p / 2 (1 - rho) keeps p + wait within h tau_ttft)
    both          mu_b = (1 - phi) r(h tau (1 - phi)) / O,  phi = mu_b p

A ``both`` replica prefilling a share phi of its time streams each decode at step / (1 - phi)
(chunked prefill: a step carrying a prefill chunk is slow for every decode in it), so its batch
must keep its decode step within h tau (1 - phi); mu_b is that fixed point (by bisection: the
right side falls as mu_b rises). h is ``tpot_headroom``.

A demand f needs f / mu_b replicas all ``both``, or f / mu_p + f / mu_d split::

    ratio = mu_b (1/mu_p + 1/mu_d)          replicas split / replicas all ``both``
    share = (1/mu_p) / (1/mu_p + 1/mu_d)    of a split pool, the prefill-only replicas

(the planner splits where the ratio is low enough and the DC's link carries the prompts' KV
cache, ``link_carries``: f n kv_bytes_per_token 8 <= share_of_link gbps 1e9).

Where the decode side is bound by its KV cache rather than its TPOT (long contexts), r does not
rise without the prefill and the split costs the prefill replicas' queueing: it is not taken.
"""

from __future__ import annotations

from dataclasses import dataclass

BISECTION_STEPS = 60


@dataclass(frozen=True, slots=True)
class StepLaw:
    """Decode step ``t0_s + batch (per_request_s + per_context_s C)``; prefill ``per_token_s``
    per new prompt token and ``per_pair_s`` per attention token pair."""

    t0_s: float
    per_request_s: float
    per_context_s: float
    per_token_s: float
    per_pair_s: float


@dataclass(frozen=True, slots=True)
class Work:
    """One request on average: ``input_tokens`` I, ``cached_share`` s, ``output_tokens`` O,
    ``kv_tokens`` k held while it runs."""

    input_tokens: float
    cached_share: float
    output_tokens: float
    kv_tokens: float


@dataclass(frozen=True, slots=True)
class Split:
    """Replica rates (requests/s), ``ratio`` = replicas split / replicas all ``both`` (inf where
    a rate is 0: a prompt alone misses the TTFT objective, or nothing fits) and the
    ``prefill_share`` a split pool runs prefill only."""

    mu_prefill: float
    mu_decode: float
    mu_both: float
    prefill_share: float
    ratio: float


def decode_rate(law: StepLaw, work: Work, step_budget_s: float, kv_batch: float) -> float:
    """r(t): decode tokens/s of the largest batch within ``step_budget_s`` and ``kv_batch``."""
    context = work.input_tokens + work.output_tokens / 2
    per = max(law.per_request_s + law.per_context_s * context, 1e-12)
    batch = max(min((step_budget_s - law.t0_s) / per, kv_batch), 0.0)
    return batch / (law.t0_s + batch * per) if batch > 0 else 0.0


def prefill_s(law: StepLaw, work: Work) -> float:
    """p: prefill seconds of one request's uncached part."""
    cached = work.cached_share * work.input_tokens
    new = work.input_tokens - cached
    return law.per_token_s * new + law.per_pair_s * new * (cached + new / 2)


def split(
    law: StepLaw,
    work: Work,
    tpot_s: float,
    ttft_s: float,
    kv_tokens: int,
    headroom: float,
    kv_share: float,
) -> Split:
    """The three rates, the ratio and the share (module docstring)."""
    kv_batch = kv_share * kv_tokens / max(work.kv_tokens, 1.0) if kv_tokens else float("inf")
    output = max(work.output_tokens, 1.0)
    p = prefill_s(law, work)
    mu_d = decode_rate(law, work, headroom * tpot_s, kv_batch) / output
    wait = headroom * ttft_s - p
    mu_p = (2 * wait / (p + 2 * wait)) / p if wait > 0 and p > 0 else 0.0

    def both_rate(mu: float) -> float:
        phi = min(mu * p, 1.0)
        return (1 - phi) * decode_rate(law, work, headroom * tpot_s * (1 - phi), kv_batch) / output

    low, high = 0.0, both_rate(0.0)
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if both_rate(mid) >= mid else (low, mid)
    mu_b = low
    if mu_p <= 0 or mu_d <= 0 or mu_b <= 0:
        return Split(mu_p, mu_d, mu_b, 0.0, float("inf"))
    per_request = 1 / mu_p + 1 / mu_d
    return Split(mu_p, mu_d, mu_b, (1 / mu_p) / per_request, per_request * mu_b)


def link_carries(rate_per_s: float, work: Work, kv_bytes_per_token: int, gbps: float, share: float) -> bool:
    """Whether ``rate_per_s`` requests' uncached KV cache fits ``share`` of a ``gbps`` link."""
    new = (1 - work.cached_share) * work.input_tokens
    return rate_per_s * new * kv_bytes_per_token * 8 <= share * gbps * 1e9
