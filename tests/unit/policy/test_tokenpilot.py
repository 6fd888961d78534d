"""TokenPilot's scoring: the instance with the lowest predicted TTFT wins, cache or no cache."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from agents.policy.tokenpilot.features import FEATURES, PRIOR
from agents.policy.tokenpilot.horizon import DecodeHorizon
from agents.policy.tokenpilot.lateness import PrefillLateness
from agents.policy.tokenpilot.predictor import OnlineLinearModel
from agents.policy.tokenpilot.queues import PrefillQueues
from agents.policy.tokenpilot.router import TokenPilot
from agents.policy.types import (
    BLOCK_TOKENS,
    BlocksChanged,
    ClusterView,
    Finished,
    FirstToken,
    Placed,
    RequestView,
)
from tests.unit.policy.helpers import cluster_view, decide


def view(running: list[int], tokens: list[int], profile: str = "p") -> ClusterView:
    return cluster_view(len(running), profile=profile, kv_total=10_000, running=running, tokens=tokens)


def request(rid: str, blocks: int = 32) -> RequestView:
    return RequestView(rid, 1, "t", "m", "interactive", blocks * BLOCK_TOKENS, 256, tuple(range(blocks)), 1.0)


def warm_pilot(spare_decodes: float = 3.0) -> TokenPilot:
    """Instance i1 holds the request's whole 16k-token prefix (a KV event said so)."""
    pilot = TokenPilot(seed=1, spare_decodes=spare_decodes)
    pilot.observe(BlocksChanged("i1", "stored", tuple(range(32)), 0.0))
    return pilot


def test_warm_instance_wins_when_its_saved_prefill_outweighs_its_load() -> None:
    pilot = warm_pilot()
    (decision,) = decide(pilot, [request("a")], view([0, 4], [0, 40_000]), 1.0)
    assert decision.instance == 1 and decision.predicted_ttft_s is not None


def test_cold_idle_instance_wins_exactly_when_predicted_latency_says_so() -> None:
    # Make i1 (warm) ever busier; the pick flips to i0 (cold, idle) at the load where the
    # model's predictions cross, and never before (TTFT alone: no TPOT term).
    flipped_at = None
    for decoding in range(0, 400, 10):
        pilot = warm_pilot(spare_decodes=0.0)
        v = view([0, decoding], [0, decoding * 40_000])
        predicted = pilot.model_for("p").predict(pilot.features(request("a"), v, 1.0))
        (decision,) = decide(pilot, [request("a")], v, 1.0)
        assert decision.instance == int(np.argmin(predicted))
        if decision.instance == 0 and flipped_at is None:
            flipped_at = decoding
    assert flipped_at is not None and flipped_at > 0


def test_a_burst_is_spread_not_piled_on_one_instance() -> None:
    pilot = TokenPilot(seed=3)
    decisions = decide(pilot, [request(f"r{k}", blocks=16) for k in range(8)], view([0] * 4, [0] * 4), 1.0)
    counts = np.bincount([d.instance for d in decisions], minlength=4)
    assert counts.max() <= 3  # same stale snapshot for all eight; own sends are accounted


def test_completions_calibrate_the_model() -> None:
    pilot = TokenPilot(seed=0)
    reference = OnlineLinearModel(FEATURES, PRIOR)  # the uncalibrated model, for the truth
    v = view([2, 2], [10_000, 10_000])
    before = dict(pilot.model_for("p").coefficients)
    for k in range(200):
        arrived = replace(request(f"r{k}", blocks=8 + k % 24), arrival_s=float(k))  # sent at once
        (d,) = decide(pilot, [arrived], v, float(k))
        features = pilot.features(arrived, v, float(k))[d.instance]
        truth = 3.0 * reference.predict_one(features)  # the real fleet is three times slower
        done = Finished(f"r{k}", 1, v.instance_ids[d.instance], "ok", 4096, 0, 10, truth, 0.02, k + 5.0)
        pilot.observe(done)
    assert pilot.model_for("p").coefficients != before
    assert pilot.models["p"].count == 200
    error = pilot.prediction_error()["p"]
    assert error is not None and error < 0.2  # from 67 % off to within a few percent


def test_a_held_request_calibrates_on_its_first_token_after_the_send_not_its_hold() -> None:
    """An admission stage held it 100 s: the completion's TTFT (from its arrival) is 100.2 s,
    but the features were recorded at the send, so the model learns the 0.2 s after it."""
    pilot = TokenPilot(seed=0)
    learnt: list[float] = []
    model = pilot.model_for("p")
    update = model.update
    model.update = lambda x, y: (learnt.append(y), update(x, y))[1]  # type: ignore[method-assign]
    held = RequestView("held", 1, "t", "m", "batch", 4096, 64, (), 0.0)  # arrived at 0 s
    (d,) = decide(pilot, [held], view([0, 0], [0, 0]), 100.0)  # sent at 100 s
    pilot.observe(Finished("held", 1, f"i{d.instance}", "ok", 4096, 0, 64, 100.2, 0.02, 101.5))
    assert learnt == [pytest.approx(0.2)]


def cold(rid: str, tokens: int) -> RequestView:
    """A request sharing no prefix with anything."""
    return RequestView(rid, 1, "t", "m", "interactive", tokens, 64, (), 0.0)


def test_queue_ahead_drains_with_time_and_empties_at_an_idle_heartbeat() -> None:
    pilot = TokenPilot(seed=0)
    busy = view([1, 1], [0, 0])
    decide(pilot, [cold("a", 32_768)], busy, 0.0)
    row = int(np.argmax(pilot.queues.tokens))
    own = 1000
    queued_now = pilot.features(cold("b", own), busy, 0.0)[row, 3]
    queued_later = pilot.features(cold("b", own), busy, 0.5)[row, 3]
    queued_much_later = pilot.features(cold("b", own), busy, 60.0)[row, 3]
    assert queued_now == 32_768 + own
    assert own < queued_later < queued_now  # draining at 8192 tokens per predicted step
    # a is long past its predicted first token and has none: the engine is still prefilling it
    assert queued_much_later == 8192 + own  # (at most one step's budget of it is kept)
    pilot.observe(FirstToken("a", 1, busy.instance_ids[row], 60.0, 60.0))
    assert pilot.features(cold("b", own), busy, 60.0)[row, 3] == own
    decide(pilot, [cold("c", 32_768)], busy, 61.0)
    idle = view([0, 0], [0, 0])
    idle.last_heartbeat_s[:] = 62.0  # both report idle after that send
    assert (pilot.features(cold("d", own), idle, 62.0)[:, 3] == own).all()


def test_a_long_prompt_does_not_join_the_step_of_a_short_one_just_queued() -> None:
    # Two idle instances; a short prompt goes first. A long one then predicts the same TTFT on
    # both rows (the short prefill ahead is tiny), but on the short one's row its first chunk
    # would share that one's only step and delay its first token: with spare_others it goes
    # to the other row every time; without, it is a coin toss.
    spared: set[bool] = set()
    tossed: set[bool] = set()
    for seed in range(8):
        for spare, picks in ((1.0, spared), (0.0, tossed)):
            pilot = TokenPilot(seed=seed, spare_others=spare, tie_tolerance=0.05)
            v = view([0, 0], [0, 0])
            (short,) = decide(pilot, [cold("short", 100)], v, 0.0)
            (long,) = decide(pilot, [cold("long", 6000)], v, 0.0)
            picks.add(long.instance != short.instance)
    assert spared == {True}
    assert tossed == {True, False}


def test_a_burst_raises_the_prediction_of_a_request_whose_step_a_later_one_joins() -> None:
    # One busy instance: a short prompt and then a long one, decided as one burst. Both wait
    # for the next step boundary; chunked prefill then runs the short prompt and the long one's
    # first chunk (the rest of the 8192-token budget) in one step, so the short prompt's first
    # token waits for that chunk too. An idle instance starts the short prompt at once, alone.
    # (Decided as they came: ``largest_first_below_kv=0``.)
    for running, joins in ((4, True), (0, False)):
        v = view([running], [running * 1000])
        alone = decide(TokenPilot(seed=0), [cold("short", 512)], v, 1.0)[0].predicted_ttft_s
        pilot = TokenPilot(seed=0, largest_first_below_kv=0.0)
        short, long = decide(pilot, [cold("short", 512), cold("long", 20_000)], v, 1.0)
        assert alone is not None and short.predicted_ttft_s is not None and long.predicted_ttft_s is not None
        theta = pilot.model_for("p").theta
        chunk = 8192 - 512  # the long prompt's first chunk fills the short prompt's step
        extra = (
            chunk * theta[FEATURES.index("prefill_tokens")]
            + chunk * (chunk / 2) * theta[FEATURES.index("prefill_pairs")]
        )
        expected = alone + extra if joins else alone
        assert abs(short.predicted_ttft_s - expected) < 1e-9
        assert long.predicted_ttft_s > short.predicted_ttft_s


def test_a_burst_is_decided_largest_prompt_first_while_the_cache_has_room() -> None:
    # Two idle instances, a short prompt and a long one arriving together. Largest first, the
    # long prompt is placed first and the short one goes around its queue: the short answer
    # does not decode beside the long prefill. The outcomes come in the order decided (the
    # order the engines receive them).
    pilot = TokenPilot(seed=0)
    first, second = decide(pilot, [cold("short", 512), cold("long", 40_000)], view([0, 0], [0, 0]), 1.0)
    assert (first.request.request_id, second.request.request_id) == ("long", "short")
    assert first.instance != second.instance


def test_a_burst_is_decided_as_it_came_once_the_cache_is_mostly_used() -> None:
    # The same burst with the candidates' KV cache 60 % used: vLLM preempts the request it
    # scheduled last when KV runs out, so a short prompt is not put behind a long one.
    pilot = TokenPilot(seed=0)
    full = cluster_view(2, profile="p", kv_total=10_000, kv_used=[6_000, 6_000])
    first, second = decide(pilot, [cold("short", 512), cold("long", 40_000)], full, 1.0)
    assert (first.request.request_id, second.request.request_id) == ("short", "long")
    below = cluster_view(2, profile="p", kv_total=10_000, kv_used=[5_999, 6_000])
    order = TokenPilot(seed=0).order(
        [cold("short", 512), cold("long", 40_000)], [np.ones(2, bool)] * 2, below
    )
    assert order == [1, 0]


def test_a_request_with_its_prompt_cached_is_decided_before_the_largest() -> None:
    # i1 holds the whole 16k-token prompt of "a" (a KV event said so): "a" has a home there and
    # goes first, where its cache is, before a longer cold prompt; cold ones go largest first.
    pilot = warm_pilot()
    batch = [cold("small", 512), cold("long", 40_000), request("a")]
    assert pilot.order(batch, [np.ones(2, bool)] * 3, view([0, 0], [0, 0])) == [2, 1, 0]
    # Not a candidate of "a": no home, so by size.
    only_i0 = np.array([True, False])
    assert pilot.order(batch, [np.ones(2, bool), np.ones(2, bool), only_i0], view([0, 0], [0, 0])) == [
        1,
        2,
        0,
    ]


def test_a_prefill_goes_where_the_decodes_have_tpot_room() -> None:
    # Four long prompts went to i0 5 s ago; its queue has drained, so a cold prompt predicts
    # the same TTFT on both rows. But i0's 60 decodes spent most of the last seconds behind
    # those prefills and their step (~0.09 s) leaves little TPOT room: with spare_decodes the
    # new prompt goes to i1 every time; without, it is a coin toss.
    spared: set[int] = set()
    tossed: set[int] = set()
    decoding = {"running": [60, 60], "tokens": [60 * 17_000] * 2}
    for seed in range(8):
        for spare, picks in ((3.0, spared), (0.0, tossed)):
            pilot = TokenPilot(seed=seed, spare_decodes=spare, tie_tolerance=0.05)
            first = cluster_view(1, kv_total=10**6, running=[60], tokens=[60 * 17_000])
            decide(pilot, [cold(f"long{k}", 16_000) for k in range(4)], first, 0.0)
            for k in range(4):  # prefilled by 4 s
                pilot.observe(FirstToken(f"long{k}", 1, "i0", 4.0, 4.0))
            v = cluster_view(2, ids=["i0", "i1"], kv_total=10**6, heartbeats=[5.0, 5.0], **decoding)
            assert (pilot.features(cold("new", 4000), v, 5.0)[:, 3] == 4000).all()  # queues empty
            (decision,) = decide(pilot, [cold("new", 4000)], v, 5.0)
            picks.add(decision.instance)
    assert spared == {1}
    assert tossed == {0, 1}


def test_the_decode_harm_horizon_is_the_median_decode_life_of_recent_completions() -> None:
    horizon = DecodeHorizon(cap_s=4.0, window=64, min_samples=8)
    for life in (0.1, 0.2, 0.3) * 2:
        horizon.add(life)
    assert horizon.value_s == 4.0  # too few completions yet: the cap
    horizon.add(0.2)
    horizon.add(0.2)
    assert horizon.value_s == 0.2  # median of 0.1, 0.1, 0.2 x 4, 0.3, 0.3
    for _ in range(64):
        horizon.add(30.0)  # long answers: the window forgets the short ones, the cap holds
    assert horizon.value_s == 4.0


def test_tokenpilot_learns_its_horizon_from_the_completions_it_sees() -> None:
    pilot = TokenPilot(seed=0, tpot_horizon_s=4.0)
    v = cluster_view(2)
    for k in range(32):
        (d,) = decide(pilot, [cold(f"r{k}", 1024)], v, float(k))
        # 10 tokens after the first at 20 ms each: a 0.2 s decode life
        pilot.observe(
            Finished(f"r{k}", 1, v.instance_ids[d.instance], "ok", 1024, 0, 11, 0.05, 0.02, k + 1.0)
        )
    assert abs(pilot.queues.horizon_s - 0.2) < 1e-9


def test_a_late_long_prompt_keeps_its_last_chunk_at_its_depth() -> None:
    # Past its predicted first token and still without one, a 32k prompt is prefilling its last
    # chunk: 8192 tokens at positions 24k..32k, whose attention pairs the queue must keep (a
    # queue of tokens without them made the wait behind a 100k prompt look like 0.25 s, not 2 s).
    pilot = TokenPilot(seed=0)
    busy = view([1, 1], [0, 0])
    decide(pilot, [cold("a", 32_768)], busy, 0.0)
    row = int(np.argmax(pilot.queues.tokens))
    own = 1000
    late = pilot.features(cold("b", own), busy, 60.0)[row]
    last_chunk_pairs = 8192 * (32_768 - 8192 / 2)
    assert late[3] == 8192 + own
    assert late[4] == last_chunk_pairs + own * own / 2


def test_long_prompts_measured_late_slow_the_drain_of_their_size() -> None:
    # Completions show 64k prompts reaching their first token twice as late as predicted: a
    # queue headed by such a prompt drains at half the predicted pace; short ones are unchanged.
    def queued_after(pilot: TokenPilot, tokens: int, t: float) -> float:
        busy = view([1, 1], [0, 0])
        decide(pilot, [cold(f"q{tokens}", tokens)], busy, 1000.0)
        row = int(np.argmax(pilot.queues.tokens))
        return float(pilot.features(cold("probe", 10), busy, 1000.0 + t)[row, 3] - 10)

    learnt = TokenPilot(seed=0)
    idle = view([0, 0], [0, 0])
    for k in range(5):
        (d,) = decide(learnt, [replace(cold(f"long{k}", 65_536), arrival_s=float(k))], idle, float(k))
        assert d.predicted_ttft_s is not None and d.instance is not None
        ttft = 2 * d.predicted_ttft_s
        learnt.observe(
            Finished(f"long{k}", 1, idle.instance_ids[d.instance], "ok", 65_536, 0, 10, ttft, 0.01, k + 100.0)
        )
    assert learnt.lateness.of(65_536) == pytest.approx(2.0) and learnt.lateness.of(8192) == 1.0
    fresh = copy.deepcopy(learnt)  # same θ and state: only the lateness differs
    fresh.lateness = PrefillLateness()
    for tokens, after_s, slower in ((65_536, 1.0, True), (4096, 0.05, False)):
        late, nominal = (
            queued_after(copy.deepcopy(learnt), tokens, after_s),
            queued_after(copy.deepcopy(fresh), tokens, after_s),
        )
        assert (late > nominal) if slower else (late == nominal)


def test_lateness_is_learnt_per_size_never_below_one_nor_below_a_smaller_size() -> None:
    lateness = PrefillLateness()
    for _ in range(3):
        lateness.add(40_000, 4.0, 6.0)  # 32k-64k: 1.5x late
        lateness.add(100_000, 10.0, 8.0)  # 64k-128k: early
        lateness.add(5000, 0.1, 0.5)  # short: the phase of a step, not its size
    assert lateness.of(40_000) == pytest.approx(1.5)
    assert lateness.of(100_000) == pytest.approx(1.5)  # not relatively faster than a smaller one
    assert lateness.of(500_000) == pytest.approx(1.5)  # a size not seen yet: the envelope
    assert lateness.of(5000) == 1.0
    rows = lateness.of_rows(np.array([0.0, 5000.0, 40_000.0, 1e6]))
    assert rows.tolist() == pytest.approx([1.0, 1.0, 1.5, 1.5])


# --- several deciders per pool: another decider's placement ----------------------------------


@pytest.mark.parametrize("with_prediction", [True, False])
def test_another_deciders_placement_counts_as_an_own_send(with_prediction: bool) -> None:
    # Decider a places a 32k prompt on a busy pool; decider b (which has decided on the same
    # snapshot) reads it from the log, with a's prediction or without (then b predicts it).
    # b's features on every row are a's (queue ahead, batch, KV, boundary wait), its send is
    # due when a's is, b credits its prefix there, and its first token clips both alike.
    a, b = TokenPilot(seed=0), TokenPilot(seed=0)
    busy = view([1, 1], [0, 0])
    b.features(cold("w", 10), busy, 0.0)
    sent = RequestView("x", 1, "t", "m", "interactive", 32_768, 64, tuple(range(64)), 0.0)
    (d,) = decide(a, [sent], busy, 0.0)
    iid = busy.instance_ids[d.instance]
    assert d.predicted_ttft_s is not None
    b.observe(Placed(sent, iid, 0.0, d.predicted_ttft_s if with_prediction else None))
    assert b._sent[sent.key].due_s == pytest.approx(a._sent[sent.key].due_s)
    assert b.index.match(sent.block_hashes) == {iid: 64}
    assert np.array_equal(b.features(cold("p", 1000), busy, 0.0), a.features(cold("p", 1000), busy, 0.0))
    assert b.features(cold("p", 1000), busy, 0.0)[d.instance, 3] == 32_768 + 1000
    for pilot in (a, b):
        pilot.observe(FirstToken("x", 1, iid, 0.5, 0.5))
    assert np.array_equal(b.features(cold("q", 1000), busy, 0.5), a.features(cold("q", 1000), busy, 0.5))


@pytest.mark.parametrize("predicted", [1.5, None])
def test_a_placement_elsewhere_counts_only_what_its_instance_did_not_hold(predicted: float | None) -> None:
    pilot = warm_pilot()  # i1 holds the 32-block prefix
    busy = view([1, 1], [0, 0])
    pilot.features(cold("w", 10), busy, 0.0)
    pilot.observe(Placed(request("x", blocks=40), "i1", 0.0, predicted))
    assert pilot.features(cold("p", 1000), busy, 0.0)[1, 3] == 8 * BLOCK_TOKENS + 1000


def test_a_router_that_has_not_decided_yet_only_credits_the_prefix_of_a_placement_elsewhere() -> None:
    pilot = TokenPilot(seed=0)
    pilot.observe(Placed(request("x", blocks=4), "i0", 0.0))
    assert pilot.index.match(tuple(range(4))) == {"i0": 4}
    assert pilot.in_flight.requests == {"i0": 1}
    assert pilot.features(cold("p", 1000), view([1, 1], [0, 0]), 0.0)[0, 3] == 1000


def test_a_placement_elsewhere_calibrates_nothing() -> None:
    pilot = TokenPilot(seed=0)
    busy = view([2, 2], [10_000, 10_000])
    pilot.features(cold("w", 10), busy, 0.1)
    pilot.observe(Placed(cold("x", 4096), "i0", 0.1))
    pilot.observe(Finished("x", 1, "i0", "ok", 4096, 0, 100, 0.9, 0.02, 2.5))
    assert pilot.model_for("p").count == 0
    assert pilot.features(cold("q", 1000), busy, 2.5)[0, 3] == 1000  # its prefill left the queue


def test_a_decider_breaks_near_ties_in_its_own_lane_and_a_clear_winner_anywhere() -> None:
    """Decider k of 2 on an idle fleet (every instance ties): it picks in its own lane (the
    CRC-32 of the instance id modulo 2 is k), so two deciders spread a burst apart; a clearly
    better instance outside the lane still wins. One decider: any instance."""
    view = cluster_view(8)
    for k in (0, 1):
        for seed in range(10):
            pilot = TokenPilot(seed=seed)
            pilot.lane = (k, 2)
            [placed] = decide(
                pilot, [RequestView(f"r{seed}", 1, "t", "m", "interactive", 600, 64, (), 0.0)], view, 0.0
            )
            assert pilot.in_lane([placed.instance_id])[0], (k, placed.instance_id)
    busy = cluster_view(2, running=[0, 40], waiting=[0, 9])  # i0 idle, i1 loaded
    for k in (0, 1):
        pilot = TokenPilot(seed=0)
        pilot.lane = (k, 2)
        [placed] = decide(pilot, [RequestView("c", 1, "t", "m", "interactive", 600, 64, (), 0.0)], busy, 0.0)
        assert placed.instance_id == "i0"


def test_a_first_token_keeps_queued_what_was_recorded_before_it_but_placed_after_it() -> None:
    """Prefill is FCFS, so a first token clears what reached the engine before it. Decider b
    sends y at 1.005 and reads decider a's x, placed at 1.000, a log delay later: x is recorded
    behind y but reached the engine first, so x's first token leaves y queued; b's own send
    placed before x (w, at 0.990) is prefilled."""
    for placed_s, still_queued in ((1.005, 1000.0), (0.990, 0.0)):
        queues = PrefillQueues()
        queues.align(cluster_view(1), np.zeros(1, dtype=bool))
        queues.add(0, 1000.0, 1000.0 * 500.0, key=("y", 1), due_s=2.0, placed_s=placed_s)
        mark = queues.add(0, 500.0, 500.0 * 250.0, key=("x", 1), due_s=1.5, placed_s=1.0, own=False)
        queues.first_token("i0", mark, ("x", 1))
        assert queues.tokens[0] == still_queued
        assert queues.pairs[0] == pytest.approx(still_queued * still_queued / 2)
        assert queues.head_tokens[0] == still_queued  # y, if queued, is the send it waits for
