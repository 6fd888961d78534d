"""Engine profiles: the step-time model of one inference instance and its capacity.

Step time of one continuous-batching step (chunked prefill)::

    T = T0 + a*sum(P_new) + b*sum(P_new*(n_ctx + P_new/2)) + c*B_dec + d*sum(C_dec)

P_new: new prefill tokens of a request in this step; n_ctx: its tokens already in the KV cache
(the b term is prefill attention, quadratic in context); B_dec: decoding requests in the step;
C_dec: their context lengths (decode attention reads the whole KV cache).

Where the figures come from (public sources, fitted by hand, bf16, vLLM-class engine):
- Decode (T0, c, d): ML.ENERGY leaderboard, vLLM on H100 80GB, median inter-token latency at
  fixed batch sizes (github.com/ml-energy/leaderboard, data/tasks/lm-arena-chat.json, 2026-02):
  Llama-3.1-8B 1xH100: 7.3 ms @ 8, 16.5 ms @ 128, 26.1 ms @ 256;
  Qwen3-14B 1xH100: 12.5 ms @ 8, 26.2 ms @ 128, 38.4 ms @ 256;
  Llama-3.1-70B TP4 H100: 16.6 ms @ 8, 27.9 ms @ 128, 39.8 ms @ 256 (chat-length contexts).
- Prefill (a, b): linear-layer cost from Microsoft Vidur's H100 operator profiles
  (github.com/microsoft/vidur, data/profiling/compute/h100, ~50k tok/s for a 7-8B model on one
  H100, ~18k tok/s for 70B at TP4) and NVIDIA NIM LLM benchmarks (TTFT at concurrency 1,
  docs.nvidia.com/nim/benchmarking/llm); b from attention FLOPs (4 * layers * hidden per token
  pair) at ~40 % of H100 bf16 peak.
- KV tokens: (0.9 * 80 GB * TP - weights - activations) / KV bytes per token, with KV bytes per
  token = 2 * layers * kv_heads * head_dim * 2 B from each model's config: 128 KiB (Llama-3-8B),
  160 KiB (Qwen3-14B), 320 KiB (Llama-3-70B, spread over 4 GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Timing and capacity of one engine instance (seconds, tokens)."""

    name: str
    t0_s: float
    prefill_s_per_token: float
    prefill_s_per_token_pair: float
    decode_s_per_seq: float
    decode_s_per_context_token: float
    kv_tokens: int
    max_seqs: int
    prefill_budget_tokens: int = 8192

    def prefill_chunk_s(self, new_tokens: int, cached_tokens: int) -> float:
        """The prefill terms of the step time for one request's chunk."""
        return self.prefill_s_per_token * new_tokens + self.prefill_s_per_token_pair * new_tokens * (
            cached_tokens + new_tokens / 2
        )


PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile("llama3-8b-h100", 6.5e-3, 25e-6, 1e-9, 35e-6, 76e-9, 420_000, 256),
        EngineProfile("qwen3-14b-h100", 12e-3, 40e-6, 2e-9, 60e-6, 95e-9, 255_000, 256),
        EngineProfile("llama3-70b-tp4-h100", 17e-3, 65e-6, 2e-9, 72e-6, 48e-9, 490_000, 256),
    )
}

PROFILE_MODELS: dict[str, str] = {
    "llama3-8b-h100": "llama3-8b",
    "qwen3-14b-h100": "qwen3-14b",
    "llama3-70b-tp4-h100": "llama3-70b",
}
"""The model each named profile serves (used when a fleet spec names no model)."""


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}") from None
