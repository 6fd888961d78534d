"""TTFT, TPOT and the duration clamp, as every measurer takes them."""

from __future__ import annotations

import math

from agents.policy.common.timing import clamp_duration, decode_s, tpot, ttft


def test_ttft_needs_a_first_token() -> None:
    assert ttft(None, 1.0) is None
    assert ttft(3.5, 1.0) == 2.5


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it() -> None:
    assert tpot(1.0, 4.0, 4) == 1.0
    assert tpot(1.0, 4.0, 1) is None  # one token: no time per output token
    assert tpot(None, 4.0, 4) is None and tpot(1.0, None, 4) is None
    assert decode_s(1.0, 4) == 3.0


def test_a_reported_duration_is_clamped_into_range() -> None:
    assert clamp_duration(-0.5, 10.0) == 0.0
    assert clamp_duration(12.0, 10.0) == 10.0
    assert clamp_duration(math.nan, 10.0) == 0.0
    assert clamp_duration(3.0, 10.0) == 3.0
