"""How a response's latencies are taken, wherever they come from (the simulator, the emulated
fleet, a real engine's stream):

- TTFT = first token - arrival (no first token: none);
- TPOT = (last token - first token) / (output tokens - 1), for two output tokens or more (a
  response of one token has none), and, back from it, the decode time ``decode_s``;
- a reported duration is clamped into [0, ``longest``] (``clamp_duration``): a clock slightly
  ahead gives 0, a request that arrived long before a replay started the longest duration.
"""

from __future__ import annotations


def ttft(first_token_s: float | None, arrival_s: float) -> float | None:
    """Time to first token; None without a first token."""
    return None if first_token_s is None else first_token_s - arrival_s


def tpot(first_token_s: float | None, last_token_s: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first; None without both tokens or for one token."""
    if first_token_s is None or last_token_s is None or output_tokens <= 1:
        return None
    return (last_token_s - first_token_s) / (output_tokens - 1)


def decode_s(tpot_s: float, output_tokens: int) -> float:
    """First token to last: the span ``tpot`` is averaged over."""
    return tpot_s * (output_tokens - 1)


def clamp_duration(seconds: float, longest: float) -> float:
    """``seconds`` taken into [0, ``longest``] (NaN: 0)."""
    return min(max(0.0, seconds), longest)
