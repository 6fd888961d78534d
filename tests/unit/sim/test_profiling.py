"""Dynamo's profiling step on the engine model: monotone, exact to the step-time law, and the SLO
holds at the throughput it reports."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES
from sim.engine.profiling import (
    DECODE_OSL,
    decode_itl_s,
    max_concurrency,
    prefill_ttft_s,
    profile_engine,
    profiles_for_fleet,
)
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from tests.unit.sim.helpers import LLAMA, fleet_of, request, workload


def test_profile_is_monotone_and_fast() -> None:
    engine = replace(LLAMA, name="llama-profiling-test")  # not in the cache yet
    started = time.perf_counter()
    profile = profile_engine(engine, 2.0, 0.1)
    assert time.perf_counter() - started < 2.0
    assert all(b > a for a, b in zip(profile.prefill_ttft_s, profile.prefill_ttft_s[1:], strict=False))
    assert all(
        b <= a for a, b in zip(profile.decode_tokens_per_s, profile.decode_tokens_per_s[1:], strict=False)
    )
    assert all(
        b <= a for a, b in zip(profile.decode_concurrency, profile.decode_concurrency[1:], strict=False)
    )
    assert profile.prefill_isl[0] == 100 and profile.decode_context[0] == 100 + DECODE_OSL / 2


def test_prefill_ttft_is_the_chunked_step_time_law() -> None:
    def step(new: int, cached: int) -> float:
        return (
            LLAMA.t0_s
            + LLAMA.prefill_s_per_token * new
            + LLAMA.prefill_s_per_token_pair * new * (cached + new / 2)
        )

    assert prefill_ttft_s(LLAMA, 4096) == pytest.approx(step(4096, 0), rel=1e-12)
    assert prefill_ttft_s(LLAMA, 10_000) == pytest.approx(
        step(8192, 0) + step(10_000 - 8192, 8192), rel=1e-12
    )


def test_decode_itl_is_the_mean_decode_step_of_the_window() -> None:
    isl, n = 2000, 40
    steps = DECODE_OSL - 2  # the first finisher decoded twice before all n were decoding
    contexts = (isl + 2) + (n - 1) * (isl + 1)
    first = LLAMA.t0_s + LLAMA.decode_s_per_seq * n + LLAMA.decode_s_per_context_token * contexts
    growth = LLAMA.decode_s_per_context_token * n  # every step adds one token to each context
    expected = first + growth * (steps - 1) / 2
    assert decode_itl_s(LLAMA, isl, DECODE_OSL, n) == pytest.approx(expected, rel=1e-9)


def test_decode_point_meets_the_itl_target_and_one_more_request_would_not() -> None:
    target = 0.03  # tighter than the KV cache's limit at short contexts
    profile = profile_engine(LLAMA, 2.0, target)
    checked = 0
    for context, n, itl, tokens in zip(
        profile.decode_context,
        profile.decode_concurrency,
        profile.decode_itl_s,
        profile.decode_tokens_per_s,
        strict=True,
    ):
        isl = int(context - DECODE_OSL / 2)
        assert tokens == pytest.approx(n / itl)
        if decode_itl_s(LLAMA, isl, DECODE_OSL, 1) > target:
            assert n == 1  # unreachable: Dynamo's lowest point
            continue
        assert itl <= target
        if n < max_concurrency(LLAMA, isl, DECODE_OSL):
            assert decode_itl_s(LLAMA, isl, DECODE_OSL, n + 1) > target
            checked += 1
    assert checked >= 2  # the target, not the cache, bound some points


def test_prefill_meets_the_ttft_target_at_the_throughput_it_reports() -> None:
    isl = 4182
    ttft = prefill_ttft_s(LLAMA, isl)
    profile = profile_engine(LLAMA, ttft * 1.01, 0.1)
    throughput = profile.prefill_throughput(isl)  # a grid point: no interpolation
    gap = isl / throughput  # requests arriving at exactly the reported throughput
    result = simulate(
        workload(*(request(f"r{i}", i * gap, isl, 1) for i in range(20))),
        fleet_of(1),
        "round-robin",
        SimConfig(),
    )
    ttfts = [a.first_token_s - a.arrival_s for a in result.attempts if a.first_token_s is not None]
    assert len(ttfts) == 20
    assert max(ttfts) <= profile.ttft_s


def test_profiles_for_fleet_keys_each_model_version() -> None:
    fleet = FleetSpec(
        "two",
        (
            InstanceSpec("a", "A", "llama3-8b", "1", LLAMA),
            InstanceSpec("b", "A", "llama3-8b", "1", LLAMA),
            InstanceSpec("c", "B", "qwen3-14b", "2", PROFILES["qwen3-14b-h100"]),
        ),
    )
    profiles = profiles_for_fleet(fleet, 2.0, 0.1)
    assert set(profiles) == {("llama3-8b", "1"), ("qwen3-14b", "2")}
    assert profiles[("llama3-8b", "1")] is profile_engine(LLAMA, 2.0, 0.1)  # cached
