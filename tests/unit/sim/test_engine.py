"""The instance model against its own formulas: step time, prefix reuse, queueing (M/D/1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.pipeline import Scheduler
from agents.policy.types import BLOCK_TOKENS, BoolArray, ClusterView, Placement, RequestView
from sim.engine.attempt import Attempt
from sim.engine.instance import Instance
from sim.engine.profiles import EngineOptions, KvAllocation
from sim.loop.config import SimConfig
from sim.loop.runner import Simulation, simulate
from tests.unit.sim.helpers import LLAMA, fleet_of, request, with_budget, workload


def prefill_s(new: int, cached: int) -> float:
    """Step time of a step that only prefills ``new`` tokens on top of ``cached`` ones."""
    return (
        LLAMA.t0_s
        + LLAMA.prefill_s_per_token * new
        + LLAMA.prefill_s_per_token_pair * new * (cached + new / 2)
    )


def decode_s(steps: int, context: int) -> float:
    """``steps`` decode steps of one request alone, its context growing from ``context``."""
    alpha = LLAMA.t0_s + LLAMA.decode_s_per_seq + LLAMA.decode_s_per_context_token * context
    return sum(alpha + LLAMA.decode_s_per_context_token * i for i in range(steps))


def run_one(*reqs, fleet=None, policy="round-robin", config=None):  # type: ignore[no-untyped-def]
    result = simulate(workload(*reqs), fleet or fleet_of(1), policy, config or SimConfig())
    return {(a.request.request_id, a.attempt): a for a in result.attempts}


def test_idle_instance_ttft_is_the_step_time_formula() -> None:
    attempts = run_one(request("a", 0.0, 4096, 10))
    a = attempts[("a", 1)]
    assert a.status == "ok"
    assert a.first_token_s == pytest.approx(prefill_s(4096, 0), rel=1e-12)
    # First token comes with the prefill; the other 9 are decode steps of a batch of one.
    assert a.end_s == pytest.approx(prefill_s(4096, 0) + decode_s(9, 4097), rel=1e-12)
    assert a.generated == 10


def test_the_client_sees_each_token_the_profiles_delay_after_its_step() -> None:
    """``token_delay_s``: the first token and the end reach the client that much later (TTFT and
    E2E include it, TPOT does not)."""
    delayed = replace(LLAMA, token_delay_s=0.02)
    a = run_one(request("a", 0.0, 4096, 10), fleet=fleet_of(1, delayed))[("a", 1)]
    assert a.first_token_s == pytest.approx(prefill_s(4096, 0) + 0.02, rel=1e-12)
    assert a.end_s == pytest.approx(prefill_s(4096, 0) + decode_s(9, 4097) + 0.02, rel=1e-12)


def test_the_delays_noise_varies_each_attempts_way_back_about_its_mean() -> None:
    """``token_delay_sigma``: each attempt's delay is ``token_delay_s`` times a factor of its own,
    lognormal with mean 1; the steps are as without it."""
    noisy = replace(LLAMA, token_delay_s=0.05, token_delay_sigma=0.5)
    reqs = [request(f"r{k}", 10.0 * k, 512, 1) for k in range(200)]
    delays = np.array(
        [
            a.first_token_s - a.arrival_s - prefill_s(512, 0)
            for a in run_one(*reqs, fleet=fleet_of(1, noisy)).values()
        ]
    )
    assert delays.mean() == pytest.approx(0.05, rel=0.1)
    assert np.log(delays).std() == pytest.approx(0.5, rel=0.15)


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    a = run_one(request("a", 0.0, 20_000, 1))[("a", 1)]
    expected = prefill_s(8192, 0) + prefill_s(8192, 8192) + prefill_s(20_000 - 16_384, 16_384)
    assert a.first_token_s == pytest.approx(expected, rel=1e-12)


def test_resident_prefix_is_reused_exactly_and_prefill_gets_cheaper() -> None:
    shared = list(range(8))  # 8 blocks = 4096 tokens in common
    first = request("first", 0.0, 6000, 1, [*shared, 100, 101, 102])
    second = request("second", 10.0, 7000, 1, [*shared, 200, 201, 202, 203])
    attempts = run_one(first, second)
    b = attempts[("second", 1)]
    assert b.cached_tokens == 8 * BLOCK_TOKENS
    new = 7000 - 8 * BLOCK_TOKENS
    assert b.first_token_s - b.arrival_s == pytest.approx(prefill_s(new, 8 * BLOCK_TOKENS), rel=1e-12)
    assert b.first_token_s - b.arrival_s < prefill_s(7000, 0)


def test_prefix_match_stops_at_first_differing_block() -> None:
    # Same block ids after a difference do not count: the chained prefix differs.
    first = request("first", 0.0, 4096, 1, [1, 2, 3, 4, 5, 6, 7, 8])
    second = request("second", 10.0, 4096, 1, [1, 2, 9, 4, 5, 6, 7, 8])
    b = run_one(first, second)[("second", 1)]
    assert b.cached_tokens == 2 * BLOCK_TOKENS


def test_a_prefix_tail_is_reused_once_its_blocks_are_resident_and_only_then() -> None:
    """``prefix_tail`` [blocks, tokens]: an engine holding the first ``blocks`` blocks of the chain
    also holds ``tokens`` more (vLLM's finer blocks); holding fewer, it reuses whole blocks only."""
    shared = list(range(4))
    first = request("first", 0.0, 2300, 1, shared)
    second = request("second", 10.0, 2400, 1, [*shared], prefix_tail=(4, 250))
    b = run_one(first, second)[("second", 1)]
    assert b.cached_tokens == 4 * BLOCK_TOKENS + 250
    assert b.first_token_s - b.arrival_s == pytest.approx(prefill_s(2400 - 2298, 2298), rel=1e-12)
    partly = request("partly", 0.0, 2300, 1, [0, 1, 2, 9])  # holds 3 of the 4 blocks
    c = run_one(partly, replace(second, arrival_s=10.0))[("second", 1)]
    assert c.cached_tokens == 3 * BLOCK_TOKENS


def test_fully_cached_prompt_recomputes_its_last_token() -> None:
    blocks = list(range(8))
    second = run_one(request("a", 0.0, 4096, 1, blocks), request("b", 5.0, 4096, 1, blocks))[("b", 1)]
    assert second.cached_tokens == 4095
    assert second.first_token_s - second.arrival_s == pytest.approx(prefill_s(1, 4095), rel=1e-12)


def test_request_joining_mid_decode_starts_at_the_next_step_boundary() -> None:
    # "a" decodes alone (a macro-step of 99 steps); "b" arrives in the middle of it.
    a_first_token = prefill_s(1000, 0)
    arrival_b = a_first_token + 0.1
    attempts = run_one(request("a", 0.0, 1000, 100), request("b", arrival_b, 1000, 1))
    a, b = attempts[("a", 1)], attempts[("b", 1)]
    # Boundaries of a's decode steps: the first one at or after b's arrival is when b's step starts.
    t, ctx = a_first_token, 1001
    while t < arrival_b:
        t += LLAMA.t0_s + LLAMA.decode_s_per_seq + LLAMA.decode_s_per_context_token * ctx
        ctx += 1
    mixed = prefill_s(1000, 0) + LLAMA.decode_s_per_seq + LLAMA.decode_s_per_context_token * ctx
    assert b.first_token_s == pytest.approx(t + mixed, rel=1e-9)
    assert a.status == b.status == "ok"
    assert a.generated == 100


def test_kv_capacity_makes_requests_wait_not_fail() -> None:
    small = fleet_of(
        1,
        profile=LLAMA.__class__(**{**{f: getattr(LLAMA, f) for f in LLAMA.__slots__}, "kv_tokens": 4 * 4096}),
    )
    reqs = [request(f"r{i}", 0.0, 3500, 200) for i in range(6)]
    attempts = run_one(*reqs, fleet=small)
    # Each needs ceil(3700/512)=8 blocks of 32: four run at once, the others wait for a slot.
    firsts = sorted(a.first_token_s for a in attempts.values())
    assert all(a.status == "ok" for a in attempts.values())
    assert firsts[4] > min(a.end_s for a in attempts.values()) - 1e-12


def test_request_larger_than_the_whole_cache_is_rejected() -> None:
    a = run_one(request("huge", 0.0, LLAMA.kv_tokens + 1, 1, slo_class="long_context"))[("huge", 1)]
    assert a.status == "rejected"


def test_md1_mean_queueing_delay() -> None:
    """One instance, equal prefill-only requests, one per step, Poisson arrivals: M/D/1."""
    size = 2048
    profile = with_budget(LLAMA, size)
    service = profile.t0_s + profile.prefill_chunk_s(size, 0)
    rho = 0.7
    rng = np.random.default_rng(7)
    n = 40_000
    arrivals = np.cumsum(rng.exponential(service / rho, n))
    reqs = [request(f"q{i}", float(t), size, 1) for i, t in enumerate(arrivals)]
    result = simulate(workload(*reqs), fleet_of(1, profile), "round-robin", SimConfig(heartbeat_s=5.0))
    waits = [a.first_token_s - a.arrival_s - service for a in result.attempts]  # type: ignore[operator]
    expected = rho * service / (2 * (1 - rho))
    assert np.mean(waits) == pytest.approx(expected, rel=0.05)


def test_abort_of_a_blocked_waiting_request_lets_the_next_one_in_at_the_next_step() -> None:
    # 11 blocks of KV, reservations = prompt + 2048 budget. "a" decodes holding 6; "b" (needs 10)
    # blocks the queue head; "c" (needs 5, would fit) waits behind it. b's client gives up
    # (batch deadline) mid-decode: c must start at the next step boundary, not when a ends.
    # (Reservations: with vLLM's on-demand allocation b would simply run.)
    tiny = replace(LLAMA, kv_tokens=11 * BLOCK_TOKENS, options=EngineOptions(kv_allocation="reserve"))
    a = request("a", 0.0, 1000, 2000, slo_class="batch", deadline_s=1000.0)
    b = request("b", 0.2, 3000, 1, slo_class="batch", deadline_s=0.3)
    c = request("c", 0.21, 400, 1, slo_class="batch", deadline_s=1000.0)
    attempts = run_one(a, b, c, fleet=fleet_of(1, tiny), config=SimConfig(output_budget=2048))
    assert attempts[("b", 1)].status == "aborted"
    got = attempts[("c", 1)]
    assert got.status == "ok" and got.first_token_s is not None
    assert got.first_token_s < 0.5 + 0.1  # started right after b's give-up at 0.5 s


class ViewRecorder:
    """An instance-selection stage that places on row 0 and keeps every snapshot it was shown."""

    name = "recorder"
    wants_kv_events = False

    def __init__(self) -> None:
        self.views: list[ClusterView] = []

    def place(
        self, requests: Sequence[RequestView], masks: Sequence[BoolArray], view: ClusterView, now_s: float
    ) -> list[Placement]:
        self.views.append(view)
        return [Placement(0, "first row") for _ in requests]

    def observe(self, event: object) -> None:
        pass


@pytest.mark.parametrize("allocation", ["reserve", "on-demand"])
def test_heartbeats_do_not_reveal_the_true_output_length(allocation: KvAllocation) -> None:
    shown = []
    profile = replace(LLAMA, options=EngineOptions(kv_allocation=allocation))
    for true_output in (500, 1900):  # both still decoding when "b" arrives at 0.3 s
        recorder = ViewRecorder()
        reqs = workload(request("a", 0.0, 1024, true_output), request("b", 0.3, 100, 1))
        Simulation(
            reqs, fleet_of(1, profile), Scheduler("recorder", PassThrough(), HomeDc(), recorder), SimConfig()
        ).run()
        view = recorder.views[-1]
        shown.append((view.kv_used.tolist(), view.tokens_in_flight.tolist(), view.running.tolist()))
    assert shown[0] == shown[1]
    if allocation == "reserve":
        assert shown[0][0][0] == -(-(1024 + 2048) // BLOCK_TOKENS)  # reserved for the budget
    else:  # the blocks its context occupies so far: prompt + ~40 tokens at 0.3 s
        assert shown[0][0][0] == -(-(1024 + 41) // BLOCK_TOKENS)


def test_the_engine_tells_the_step_in_progress_and_the_last_step_ended() -> None:
    """``step_end_after`` / ``last_step`` inside a macro-step of decode steps (what the phase
    benchmark reads): the boundaries are the same decode-step sums as above."""
    spec = fleet_of(1).instances[0]
    engine = Instance(spec, (0.0, 100.0), kv_events=False)  # (this profile has no step noise)
    assert engine.step_end_after(0.0) is None  # idle
    engine.enqueue(Attempt(request("a", 0.0, 1000, 100), 1, 0.0, 100), 0.0)
    first_token = engine.step_end_s
    assert first_token == pytest.approx(prefill_s(1000, 0), rel=1e-9)
    assert engine.last_step(first_token / 2) is None  # nothing ended yet in this (prefill) step
    engine.finish_step(first_token)  # then a macro-step of 99 decode steps
    boundaries, t, ctx = [], first_token, 1001
    for _ in range(5):
        t += LLAMA.t0_s + LLAMA.decode_s_per_seq + LLAMA.decode_s_per_context_token * ctx
        ctx += 1
        boundaries.append(t)
    middle = (boundaries[2] + boundaries[3]) / 2
    assert engine.step_end_after(middle) == pytest.approx(boundaries[3], rel=1e-9)
    end, length = engine.last_step(middle)  # type: ignore[misc]
    assert end == pytest.approx(boundaries[2], rel=1e-9)
    assert length == pytest.approx(boundaries[2] - boundaries[1], rel=1e-9)
    assert engine.last_step(first_token) is None  # the macro-step has just begun
