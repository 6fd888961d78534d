"""The instance model against vLLM V1's scheduler: waiting until the first chunk, decode tokens
in the token budget, on-demand KV with recompute pre-emption, the perturbed engine profile, and
macro-steps that stay exact (against a step-by-step reference)."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

import numpy as np
import pytest

from agents.policy.types import BLOCK_TOKENS
from sim.engine.attempt import Attempt
from sim.engine.fleet import InstanceSpec, parse_fleet
from sim.engine.instance import Instance
from sim.engine.profiles import PROFILES, EngineOptions, EngineProfile, get_profile, noise_seed
from tests.unit.sim.helpers import LLAMA, request

PERTURBED = get_profile("llama3-8b-h100-perturbed")


def instance(
    profile: EngineProfile = LLAMA, instance_id: str = "i0", options: EngineOptions | None = None
) -> Instance:
    spec = InstanceSpec(instance_id, "dc-1", "llama3-8b", "1", profile)
    return Instance(spec, (0.0, 1e9), kv_events=False, options=options)


def attempt(rid: str, input_tokens: int, output_tokens: int, budget: int = 2048, at: float = 0.0) -> Attempt:
    return Attempt(request(rid, at, input_tokens, output_tokens), 1, at, budget)


def drain(engine: Instance) -> list[Attempt]:
    """Run the instance's steps until it is idle; the attempts that ended."""
    ended = []
    while engine.scheduled:
        ended += engine.finish_step(engine.step_end_s)
    return ended


class StepByStep(Instance):
    """The reference: every step planned on its own (no macro-steps)."""

    def _plan(self, now_s: float) -> None:
        super()._plan(now_s)
        if self.scheduled and self._steps > 1:
            self._steps = 1
            self.step_end_s = now_s + self._elapsed(1)


# --- waiting as vLLM V1 reports it ------------------------------------------------------------


def test_a_request_behind_a_long_prompt_waits_until_its_first_chunk_is_scheduled() -> None:
    engine = instance()
    long, short = attempt("long", 20_000, 5), attempt("short", 1000, 5)
    engine.enqueue(long, 0.0)  # an idle instance starts a step at once: 8192 tokens of "long"
    engine.enqueue(short, 0.0)  # joins at the next step boundary
    assert engine.heartbeat(0.0)[:2] == (1, 1)
    engine.finish_step(engine.step_end_s)  # step 2: the next 8192 of "long" spend the budget
    assert engine.heartbeat(engine.step_start_s)[:2] == (1, 1)  # "short" has KV room but waits
    assert short.admitted_s is None
    engine.finish_step(engine.step_end_s)  # step 3: the last 3616 of "long", then "short" fits
    assert engine.heartbeat(engine.step_start_s)[:2] == (0, 2)
    assert short.admitted_s == engine.step_start_s
    assert all(a.status == "ok" and a.generated == 5 for a in drain(engine))


def test_the_older_model_counted_a_request_running_once_its_kv_fitted() -> None:
    engine = instance(replace(LLAMA, max_seqs=256), options=EngineOptions.legacy())
    engine.enqueue(attempt("long", 20_000, 5), 0.0)
    engine.enqueue(attempt("short", 1000, 5), 0.0)
    engine.finish_step(engine.step_end_s)  # step 2: 8192 of "long"; "short" gets no token
    assert engine.heartbeat(engine.step_start_s)[:2] == (0, 2)


def test_max_num_seqs_defaults_to_1024_and_bounds_running() -> None:
    assert all(p.max_seqs == 1024 for p in PROFILES.values())
    engine = instance(replace(LLAMA, max_seqs=3))
    for i in range(5):
        engine.enqueue(attempt(f"r{i}", 10, 50), 0.0)
    engine.finish_step(engine.step_end_s)
    assert engine.heartbeat(engine.step_start_s)[:2] == (2, 3)


# --- the token budget counts decode tokens ----------------------------------------------------


def test_decoding_requests_consume_the_token_budget() -> None:
    budget = 64
    engines = {
        counted: instance(
            replace(LLAMA, prefill_budget_tokens=budget),
            options=EngineOptions(decode_tokens_in_budget=counted),
        )
        for counted in (True, False)
    }
    for counted, engine in engines.items():
        decoders = [attempt(f"d{i}", 5, 100) for i in range(10)]
        for a in decoders:
            engine.enqueue(a, 0.0)
        engine.finish_step(engine.step_end_s)  # d0's prompt, then d0's decode + nine prompts
        engine.finish_step(engine.step_end_s)
        assert all(a.generated >= 1 for a in decoders)
        big = attempt("big", 1000, 1)
        engine.enqueue(big, engine.step_start_s + 1e-4)  # joins at the end of the step in progress
        engine.finish_step(engine.step_end_s)  # ten decodes + "big"'s first chunk
        engine.finish_step(engine.step_end_s)
        assert big.context == (budget - 10 if counted else budget)


def test_more_decoders_than_the_budget_take_turns_in_running_order() -> None:
    # Budget 4: four 1-token prompts, then four decodes fill every step; the other two wait.
    engine = instance(replace(LLAMA, prefill_budget_tokens=4))
    reqs = [attempt(f"r{i}", 1, 20) for i in range(6)]
    for a in reqs:
        engine.enqueue(a, 0.0)
    engine.finish_step(engine.step_end_s)
    assert engine.heartbeat(engine.step_start_s)[:2] == (2, 4)
    ended = drain(engine)
    assert all(a.status == "ok" and a.generated == 20 for a in ended) and len(ended) == 6
    first_end = min(a.end_s or 0.0 for a in reqs[:4])
    assert all((a.first_token_s or 0.0) > first_end for a in reqs[4:])


# --- on-demand KV and recompute pre-emption ---------------------------------------------------


def tight(blocks: int, **options: object) -> EngineProfile:
    return replace(LLAMA, kv_tokens=blocks * BLOCK_TOKENS, options=EngineOptions(**options))  # type: ignore[arg-type]


def test_growth_that_exhausts_memory_preempts_the_newest_request_which_later_completes() -> None:
    engine = instance(tight(8))
    old, new = attempt("old", 1500, 2000), attempt("new", 1500, 600)
    engine.enqueue(old, 0.0)
    engine.enqueue(new, 0.0)
    engine.finish_step(engine.step_end_s)
    assert engine.cache.referenced == 6  # 3 + 3 blocks for the prompts, none for the budget
    ended = drain(engine)
    assert {a.request.request_id for a in ended} == {"old", "new"}
    assert engine.preemptions == 1 and new.preemptions == 1 and old.preemptions == 0
    assert old.status == new.status == "ok"
    assert (old.generated, new.generated) == (2000, 600)
    assert old.end_s is not None and new.end_s is not None and new.first_token_s is not None
    assert new.first_token_s < old.end_s < new.end_s  # started, pre-empted, resumed after "old"
    # "new" (one step behind) recomputed prompt + the 548 tokens it had when "old" needed its
    # fifth block (context 2049); one of its two cached prompt blocks was evicted meanwhile.
    assert engine.preempted_prefix_cache_queries == 1500 + 548
    assert engine.preempted_prefix_cache_hits == BLOCK_TOKENS
    assert engine.prefix_cache_queries == 3000 and engine.prefix_cache_hits == 0
    assert engine.cache.referenced == 0


def test_the_newest_request_may_preempt_itself_and_reuses_its_cached_prompt() -> None:
    # 9 blocks: "new" needs its fifth block first when all 9 are taken: it is the newest.
    engine = instance(tight(9))
    old, new = attempt("old", 1500, 2000), attempt("new", 1500, 600)
    engine.enqueue(old, 0.0)
    engine.enqueue(new, 0.0)
    drain(engine)
    assert engine.preemptions == new.preemptions == 1
    assert (old.generated, new.generated) == (2000, 600)
    assert engine.preempted_prefix_cache_queries == 1500 + 549
    assert engine.preempted_prefix_cache_hits == 2 * BLOCK_TOKENS  # both prompt blocks resident


def test_first_token_is_reported_once_for_a_preempted_request() -> None:
    engine = instance(tight(8))
    old, new = attempt("old", 1500, 2000), attempt("new", 1500, 600)
    engine.enqueue(old, 0.0)
    engine.enqueue(new, 0.0)
    seen = []
    while engine.scheduled:
        engine.finish_step(engine.step_end_s)
        seen += [a.request.request_id for a in engine.first_tokens]
        engine.first_tokens.clear()
    assert sorted(seen) == ["new", "old"]


def test_reserve_mode_keeps_the_older_kv_model() -> None:
    # Reservations (prompt + 2048 budget = 7 blocks each of 8): the second request waits until
    # the first ends, nothing is ever pre-empted, and KV use is the reservation from the start.
    engine = instance(tight(8, kv_allocation="reserve"))
    old, new = attempt("old", 1500, 2000), attempt("new", 1500, 600)
    engine.enqueue(old, 0.0)
    engine.enqueue(new, 0.0)
    assert engine.heartbeat(0.0) == (1, 1, 3000, 7)
    drain(engine)
    assert engine.preemptions == 0
    assert old.end_s is not None and new.first_token_s is not None and new.first_token_s > old.end_s
    assert (old.generated, new.generated) == (2000, 600)


def test_legacy_options_reproduce_the_older_engine_figures() -> None:
    # The older engine: admission when the reservation fits, budget for prefill only, 256 seats.
    engine = instance(
        replace(LLAMA, max_seqs=256, kv_tokens=11 * BLOCK_TOKENS), options=EngineOptions.legacy()
    )
    a, b = attempt("a", 1000, 50), attempt("b", 3000, 1)
    engine.enqueue(a, 0.0)
    engine.enqueue(b, 0.0)  # needs 10 blocks, 5 free: queued although the budget would reach it
    assert engine.heartbeat(0.0) == (1, 1, 4000, 6)
    drain(engine)
    alpha = LLAMA.t0_s + LLAMA.decode_s_per_seq + LLAMA.decode_s_per_context_token * 1001
    first = LLAMA.t0_s + LLAMA.prefill_chunk_s(1000, 0)
    assert a.end_s == pytest.approx(
        first + 49 * alpha + LLAMA.decode_s_per_context_token * 49 * 48 / 2, rel=1e-12
    )
    assert a.end_s is not None
    assert b.first_token_s == pytest.approx(a.end_s + LLAMA.t0_s + LLAMA.prefill_chunk_s(3000, 0), rel=1e-12)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        EngineOptions(kv_allocation="on-demand", admission="kv-fits")
    with pytest.raises(ValueError):
        EngineOptions(kv_allocation="paged")  # type: ignore[arg-type]


# --- the perturbed engine profile -------------------------------------------------------------


def test_perturbed_fleet_spec_parses() -> None:
    fleet = parse_fleet("8xllama3-8b-h100-perturbed")
    assert len(fleet.instances) == 8
    assert {s.model for s in fleet.instances} == {"llama3-8b"}
    assert {s.profile.name for s in fleet.instances} == {"llama3-8b-h100-perturbed"}


def test_perturbed_step_time_departs_from_the_nominal_law_not_by_a_constant_factor() -> None:
    def prefill(p: EngineProfile, new: int, ctx: int) -> float:
        return p.t0_s + p.prefill_chunk_s(new, ctx)

    def decode(p: EngineProfile, batch: int, ctx: int) -> float:
        return p.t0_s + p.decode_terms_s(batch, batch * ctx, batch * ctx * ctx)

    ratios = [
        prefill(PERTURBED, 8192, 0) / prefill(LLAMA, 8192, 0),
        prefill(PERTURBED, 8192, 24_576) / prefill(LLAMA, 8192, 24_576),
        decode(PERTURBED, 64, 1000) / decode(LLAMA, 64, 1000),
        decode(PERTURBED, 64, 30_000) / decode(LLAMA, 64, 30_000),
    ]
    assert ratios[1] > 1.5 * ratios[0]  # prefill attention grows faster with context
    assert ratios[2] < 0.97 and ratios[3] > 1.3  # decode: cheaper at short context, dearer at long


def prefill_only_ratios(engine: Instance, n: int) -> list[float]:
    """Observed / noiseless duration of ``n`` single prefill steps, one after the other."""
    profile = engine.profile
    ratios = []
    for i in range(n):
        engine.enqueue(attempt(f"p{i}", 2000, 1), engine.step_end_s)
        law = profile.t0_s + profile.prefill_chunk_s(2000, 0)
        ratios.append((engine.step_end_s - engine.step_start_s) / law)
        drain(engine)
    return ratios


def test_perturbed_noise_is_about_ten_percent_and_deterministic() -> None:
    ratios = prefill_only_ratios(instance(PERTURBED, "i003"), 2000)
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(ratios) == pytest.approx(0.10, abs=0.01)
    assert prefill_only_ratios(instance(PERTURBED, "i003"), 50) == ratios[:50]  # same instance: same
    assert prefill_only_ratios(instance(PERTURBED, "i004"), 50) != ratios[:50]  # another: its own
    other_seed = EngineOptions(noise_seed=1)
    assert prefill_only_ratios(instance(PERTURBED, "i003", other_seed), 50) != ratios[:50]
    assert prefill_only_ratios(instance(LLAMA), 5) == pytest.approx([1.0] * 5, rel=1e-12)  # no noise


def test_perturbed_macro_step_is_exact_with_its_noise_factor() -> None:
    engine = instance(PERTURBED, "i001")
    one = attempt("one", 1000, 200)
    engine.enqueue(one, 0.0)
    drain(engine)
    rng = random.Random(noise_seed("i001", PERTURBED, EngineOptions()))
    prefill_factor = rng.lognormvariate(PERTURBED.noise_mu, PERTURBED.noise_sigma)
    decode_factor = rng.lognormvariate(PERTURBED.noise_mu, PERTURBED.noise_sigma)  # one macro-step
    first = prefill_factor * (PERTURBED.t0_s + PERTURBED.prefill_chunk_s(1000, 0))
    assert one.first_token_s == pytest.approx(first, rel=1e-12)
    assert one.end_s == pytest.approx(first + decode_factor * PERTURBED.decode_alone_s(1001, 199), rel=1e-12)


# --- macro-steps against the step-by-step reference -------------------------------------------


def replay(engine: Instance, arrivals: list[Attempt], probes: list[float]) -> list[tuple[int, int, int, int]]:
    """Feed arrivals at their times, drive step ends, record heartbeats at ``probes``."""
    events = sorted(
        [(a.arrival_s, 1, i) for i, a in enumerate(arrivals)] + [(t, 2, i) for i, t in enumerate(probes)]
    )
    beats = []
    for time_s, kind, index in events:
        while engine.scheduled and engine.step_end_s <= time_s:
            engine.finish_step(engine.step_end_s)
        if kind == 1:
            engine.enqueue(arrivals[index], time_s)
        else:
            beats.append(engine.heartbeat(time_s))
    drain(engine)
    return beats


@pytest.mark.parametrize(
    "profile",
    [
        tight(30),  # on-demand, memory tight: block-capped macro-steps and pre-emptions
        replace(PERTURBED, noise_sigma=0.0, kv_tokens=30 * BLOCK_TOKENS),  # the perturbed law
        tight(30, kv_allocation="reserve"),
        replace(tight(30), prefill_budget_tokens=6),  # more decoders than the budget
    ],
    ids=["on-demand", "perturbed-law", "reserve", "budget-6"],
)
def test_macro_steps_match_the_step_by_step_reference(profile: EngineProfile) -> None:
    rng = np.random.default_rng(3)
    n = 40
    times = np.sort(rng.uniform(0.0, 4.0, n))
    shapes = [(int(rng.integers(1, 1800)), int(rng.integers(1, 1200))) for _ in range(n)]

    Outcome = tuple[str, int, float | None, float | None, int, int]

    def run(kind: type[Instance]) -> tuple[list[Outcome], list[tuple[int, int, int, int]], int]:
        spec = InstanceSpec("i0", "dc-1", "llama3-8b", "1", profile)
        engine = kind(spec, (0.0, 1e9), kv_events=False)
        arrivals = [
            Attempt(
                request(
                    f"r{i}", float(t), p, o, list(range(1000 * (i % 5), 1000 * (i % 5) + p // BLOCK_TOKENS))
                ),
                1,
                float(t),
                1200,
            )
            for i, (t, (p, o)) in enumerate(zip(times, shapes, strict=True))
        ]
        beats = replay(engine, arrivals, [float(t) for t in rng_probes])
        outcome = [
            (a.status, a.generated, a.first_token_s, a.end_s, a.cached_tokens, a.preemptions)
            for a in arrivals
        ]
        return outcome, beats, engine.preemptions

    rng_probes = np.random.default_rng(5).uniform(0.0, 40.0, 300)
    macro, reference = run(Instance), run(StepByStep)
    assert macro[2] == reference[2]
    assert macro[1] == reference[1]
    for got, want in zip(macro[0], reference[0], strict=True):
        assert got[0] == want[0] == "ok"
        assert got[1] == want[1] and got[4:] == want[4:]
        assert got[2] == pytest.approx(want[2], rel=1e-9) and got[3] == pytest.approx(want[3], rel=1e-9)
    if profile.options.kv_allocation == "on-demand" and profile.prefill_budget_tokens > 6:
        assert macro[2] > 0  # the case does exercise pre-emption
