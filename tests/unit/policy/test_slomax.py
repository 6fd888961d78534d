"""SLOMax: classification, admission reasons, pool order, shares, fairness and the controller."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.policy.baselines import LeastTokens
from agents.policy.defaults import HomeDc
from agents.policy.pipeline import Scheduler
from agents.policy.slomax import SloMax
from agents.policy.slomax.classes import ClassRules
from agents.policy.slomax.controller import Controller, Knobs
from agents.policy.slomax.errors import ErrorBounds
from agents.policy.slomax.fairness import VirtualTokenCounter, under_share
from agents.policy.slomax.feedback import ClassWindow, InMemoryGoodput
from agents.policy.slomax.placement import PrefillLoad
from agents.policy.types import (
    ClusterView,
    Finished,
    FirstToken,
    HeldElsewhere,
    Placed,
    RequestView,
    RowPrediction,
)
from tests.unit.policy.helpers import cluster_view


def req(
    rid: str,
    *,
    tenant: str = "t",
    slo_class: str = "",
    input_tokens: int = 1000,
    budget: int = 100,
    arrival: float = 0.0,
    deadline: float | None = None,
    task_type: str = "chat",
) -> RequestView:
    return RequestView(
        rid, 1, tenant, "m", slo_class, input_tokens, budget, (), arrival, deadline, task_type=task_type
    )


class FixedPredictor(LeastTokens):
    """A router whose predicted TTFT is set by the test: ``ttft_s`` on every row, or one value
    per row."""

    def __init__(self, ttft_s: float | list[float], own_s: float = 0.0) -> None:
        super().__init__()
        self.ttft_s = ttft_s
        self.own_s = own_s  # of it the request's own prefill (0: all waiting for the queue ahead)

    def predict_rows(self, request: RequestView, view: ClusterView, now_s: float) -> RowPrediction:
        n = len(view)
        ttft = np.broadcast_to(np.asarray(self.ttft_s, dtype=np.float64), n)
        return RowPrediction(ttft, np.full(n, self.own_s))


def slomax(predicted: float | list[float], **kwargs: object) -> tuple[Scheduler, SloMax, FixedPredictor]:
    admission = SloMax(**kwargs)  # type: ignore[arg-type]
    router = FixedPredictor(predicted)
    return Scheduler("slomax+test", admission, HomeDc(), router), admission, router


# --- classification ---------------------------------------------------------------------------


def test_classification_follows_declared_class_task_type_input_length_and_tenant_override() -> None:
    rules = ClassRules(long_input_tokens=8000, tenant_classes={"etl": "batch"}, tenant_tiers={"gold": 0})
    assert rules.classify(req("a", slo_class="long_context")).slo_class == "long_context"
    assert rules.classify(req("b", task_type="batch")).slo_class == "batch"
    assert rules.classify(req("c", input_tokens=9000)).slo_class == "long_context"
    assert rules.classify(req("d", input_tokens=7000)).slo_class == "interactive"
    assert rules.classify(req("e", tenant="etl")).slo_class == "batch"
    assert (rules.classify(req("f", tenant="gold")).tier, rules.classify(req("g")).tier) == (0, 1)
    with pytest.raises(ValueError, match="unknown classes"):
        ClassRules(tenant_classes={"x": "premium"})


# --- admission --------------------------------------------------------------------------------


def test_feasible_interactive_is_admitted_and_infeasible_is_rejected_early_with_a_retry_hint() -> None:
    s, _, router = slomax(predicted=0.5)
    (ok,) = s.submit([req("a")], cluster_view(2), 0.0)
    assert ok.action == "admit"
    # The objective is 2 s; with no measured error yet a prediction may be 2x too high (the
    # prior), so 5 s is out of reach only by 5 x 0.5 - 2 = 0.5 s.
    router.ttft_s = 5.0
    (no,) = s.submit([req("b")], cluster_view(2), 0.0)
    assert no.action == "reject" and no.reason.startswith("cannot_meet_slo")
    assert no.retry_after_s == pytest.approx(0.5) and "retry after" in no.reason


def test_an_interactive_request_over_the_headroom_is_held_then_expires_when_its_objective_passes() -> None:
    s, _, router = slomax(predicted=1.8, headroom=0.75)  # waits 1.8 > 0.75 x 2 s: held, still feasible
    (held,) = s.submit([req("a")], cluster_view(2), 0.0)
    assert (held.action, held.pool) == ("queue", "interactive")
    router.ttft_s = 1.8
    (gone,) = s.tick(cluster_view(2), 1.5)  # waited 1.5 + 1.8 x 0.5 (the low end) > 2 s
    assert gone.action == "reject" and gone.reason.startswith("expired")


def test_an_interactive_request_goes_only_where_its_own_predicted_ttft_passes_the_gate() -> None:
    s, _, router = slomax(predicted=[3.0, 0.5])  # i0 is predicted past the 1.3 s gate, i1 within
    placed = s.submit([req(f"r{i}", input_tokens=10 * (i + 1)) for i in range(4)], cluster_view(2), 0.0)
    assert [(o.action, o.instance_id) for o in placed] == [("admit", "i1")] * 4  # least tokens: i0
    router.ttft_s = [3.0, 1.5]  # nowhere within the gate, yet feasible: held
    (held,) = s.submit([req("h")], cluster_view(2), 0.0)
    assert (held.action, held.pool) == ("queue", "interactive")


def test_with_no_ready_instance_a_request_waits_in_its_pool() -> None:
    s, _, _ = slomax(predicted=0.5)
    (held,) = s.submit([req("a")], cluster_view(0), 0.0)  # a worker that has seen no heartbeat yet
    assert (held.action, held.pool) == ("queue", "interactive") and "no ready instance" in held.reason
    (admitted,) = s.tick(cluster_view(2), 0.5)
    assert admitted.action == "admit"


def test_a_request_that_waited_keeps_its_measured_lateness_from_its_slack() -> None:
    s, admission, router = slomax(predicted=0.35)  # waited 1.5 s of 2
    admission.errors.prior = ErrorBounds(0.5, 1.0, late_s=0.2)  # first tokens come 0.2 s late
    (held,) = s.submit([req("a")], cluster_view(2), 1.5)
    assert held.action == "queue"  # 1.5 + 0.35 + 0.2 (late) > 2 s
    router.ttft_s = 0.25
    (admitted,) = s.tick(cluster_view(2), 1.5)
    assert admitted.action == "admit"


def test_a_router_prediction_is_bounded_by_its_measured_error_the_pool_estimate_by_a_fixed_margin() -> None:
    # Waited 0.5 s of 2, predicted 1.22 s, predictions measured exact: it meets its objective
    # (1.72 s), but not within a fixed 25 % margin of what is left (1.5 / 1.25 = 1.2 s); and it
    # is not due (0.5 + 1.22 + a 0.25 s re-offer gap < 2 s), so only the bound decides.
    s, admission, _ = slomax(predicted=1.22)
    admission.errors.prior = ErrorBounds(1.0, 1.0)
    (admitted,) = s.submit([req("a")], cluster_view(2), 0.5)
    assert admitted.action == "admit"
    pooled = SloMax(prefill_tokens_per_s=1000 / 1.22)  # no router prediction: 1 000 tokens, 1.22 s
    pooled.errors.prior = ErrorBounds(1.0, 1.0)
    scheduler = Scheduler("slomax+least-tokens", pooled, HomeDc(), LeastTokens())
    (held,) = scheduler.submit([req("a")], cluster_view(2), 0.5)
    assert held.action == "queue" and "margin" in held.reason


def test_batch_waits_while_the_pool_is_saturated_and_takes_idle_capacity_otherwise() -> None:
    s, _, router = slomax(predicted=0.2, batch_share=0.0)
    batch = req("b", task_type="batch", deadline=3600.0)
    (idle,) = s.submit([batch], cluster_view(2), 0.0)
    assert idle.action == "admit" and "idle capacity" in idle.admission_reason
    router.ttft_s = 1.5  # saturated: over 0.5 x the interactive objective
    (busy,) = s.submit([req("b2", task_type="batch", deadline=3600.0)], cluster_view(2), 0.0)
    assert (busy.action, busy.pool) == ("queue", "batch")


def test_a_batch_request_near_its_deadline_is_urgent_and_one_that_cannot_make_it_is_rejected() -> None:
    s, _, _ = slomax(predicted=1.5, batch_share=0.0, tpot_estimate_s=0.05)  # service = 1.5 + 100 x 0.05
    (urgent,) = s.submit([req("u", task_type="batch", deadline=40.0)], cluster_view(2), 0.0)
    assert urgent.action == "admit" and "urgent" in urgent.admission_reason
    (late,) = s.submit([req("l", task_type="batch", deadline=5.0)], cluster_view(2), 0.0)
    assert late.action == "reject" and late.reason.startswith("cannot_meet_slo")


def test_the_batch_share_lets_batch_in_beside_saturation_up_to_its_tokens() -> None:
    # capacity: 2 instances x 1000 blocks x 512 tokens = 1 024 000; share 0.001 -> 1 024 tokens
    s, _, _ = slomax(predicted=1.5, batch_share=0.001)
    outcomes = s.submit(
        [req(f"b{i}", task_type="batch", deadline=3600.0, input_tokens=500, budget=100) for i in range(2)],
        cluster_view(2),
        0.0,
    )
    assert {o.request.request_id: o.action for o in outcomes} == {"b0": "admit", "b1": "queue"}


def interactive_waiting(s: Scheduler, router: FixedPredictor, now_s: float) -> None:
    """Make interactive work wait (held over its headroom, then gone): the long-prompt gates hold."""
    predicted, router.ttft_s = router.ttft_s, 1.9
    (held,) = s.submit([req("waiting")], cluster_view(2), now_s)
    assert held.action == "queue"
    s.withdraw("waiting", 1)
    router.ttft_s = predicted


def test_long_prompts_prefilling_are_bounded_per_instance_until_their_first_token() -> None:
    s, _, router = slomax(predicted=1.0, long_prefills_per_instance=1, long_share=1.0)
    interactive_waiting(s, router, 0.5)
    longs = [req(f"l{i}", input_tokens=40_000) for i in range(3)]
    outcomes = {o.request.request_id: o for o in s.submit(longs, cluster_view(2), 0.5)}
    assert {k: o.action for k, o in outcomes.items()} == {"l0": "admit", "l1": "admit", "l2": "queue"}
    assert {outcomes["l0"].instance_id, outcomes["l1"].instance_id} == {"i0", "i1"}  # one each
    s.observe(FirstToken("l0", 1, outcomes["l0"].instance_id, 1.0, 1.0))
    (now,) = s.tick(cluster_view(2), 1.0)
    assert (now.request.request_id, now.action, now.instance_id) == (
        "l2",
        "admit",
        outcomes["l0"].instance_id,
    )


def test_long_prompts_keep_to_their_share_of_instances_and_short_work_keeps_off_them() -> None:
    s, _, router = slomax(predicted=0.5, long_prefills_per_instance=2, long_share=0.25)  # 1 of 4 instances
    interactive_waiting(s, router, 0.0)
    longs = [req(f"l{i}", input_tokens=40_000) for i in range(3)]
    outcomes = {o.request.request_id: o for o in s.submit(longs, cluster_view(4), 0.0)}
    assert [outcomes[f"l{i}"].action for i in range(3)] == ["admit", "queue", "queue"]
    busy = outcomes["l0"].instance_id
    (second,) = s.tick(cluster_view(4), 0.1)  # room for one more there, and nowhere else
    assert (second.request.request_id, second.instance_id) == ("l1", busy)
    shorts = s.submit([req(f"s{i}") for i in range(6)], cluster_view(4), 0.2)
    assert all(o.action == "admit" and o.instance_id != busy for o in shorts)


def test_interactive_is_served_before_batch_and_tiers_before_both() -> None:
    s, _, _ = slomax(predicted=0.1, tenant_tiers={"gold": 0})
    requests = [
        req("b", task_type="batch", deadline=3600.0),
        req("i"),
        req("g", tenant="gold", task_type="batch"),
    ]
    admission = s.admission
    assert isinstance(admission, SloMax)
    order = [o.request.request_id for o in s.submit(requests, cluster_view(2), 0.0)]
    assert sorted(order) == ["b", "g", "i"]
    assert admission.counts == {"admit": 3}


def test_a_tenant_over_its_quota_is_rejected_with_the_reason() -> None:
    s, _, _ = slomax(predicted=0.1, tenant_quota_tokens=1500)
    outcomes = {o.request.request_id: o for o in s.submit([req("a"), req("b")], cluster_view(2), 0.0)}
    assert outcomes["a"].action == "admit"  # 1 100 tokens each: the second would pass 1 500
    assert outcomes["b"].action == "reject" and outcomes["b"].reason.startswith("over_quota")


def test_finished_requests_release_their_share() -> None:
    s, admission, _ = slomax(predicted=1.5, batch_share=0.001)
    (first,) = s.submit(
        [req("b0", task_type="batch", deadline=3600.0, input_tokens=500)], cluster_view(2), 0.0
    )
    s.observe(Finished("b0", 1, first.instance_id, "ok", 500, 0, 40, 0.5, 0.02, 2.0))
    (again,) = s.submit(
        [req("b1", task_type="batch", deadline=3600.0, input_tokens=500)], cluster_view(2), 2.0
    )
    assert again.action == "admit"
    assert admission.fair.counter("t") == pytest.approx(2 * (500 + 2 * 100) - 2 * (100 - 40))


# --- fairness ----------------------------------------------------------------------------------


def test_virtual_token_counter_serves_the_lighter_tenant_first_and_gives_idleness_no_credit() -> None:
    vtc = VirtualTokenCounter()
    vtc.charge(("a", 1), "heavy", 1.0, 1000, 500)  # 1000 + 2 x 500
    vtc.charge(("b", 1), "light", 1.0, 100, 50)
    assert vtc.counter("light") < vtc.counter("heavy")
    vtc.settle(("a", 1), output_tokens=100)  # produced 100 of its 500 budget
    assert vtc.counter("heavy") == pytest.approx(1000 + 2 * 100)
    vtc.lift("newcomer", ["heavy", "light", "newcomer"])
    assert vtc.counter("newcomer") == vtc.counter("light")


def test_a_flooding_tenant_cannot_take_the_other_tenants_share() -> None:
    """Saturated, room for one batch request per round: one tenant offers 5 per round, the other
    1; token-weighted fair queuing serves them alternately, not in proportion to what they offer."""
    admission = SloMax(batch_share=0.0006)  # 1 024 000 x 0.0006 = 614 tokens: one request at a time
    admission.bind_router(FixedPredictor(1.5))  # saturated
    waiting: list[RequestView] = []
    served = {"flood": 0, "quiet": 0}
    for k in range(20):
        waiting += [
            req(f"f{k}-{i}", tenant="flood", task_type="batch", deadline=1e6, input_tokens=400)
            for i in range(5)
        ]
        waiting.append(req(f"q{k}", tenant="quiet", task_type="batch", deadline=1e6, input_tokens=400))
        answers = admission.admit(waiting, cluster_view(2), float(k))
        admitted = [r for r, a in zip(waiting, answers, strict=True) if a.action == "admit"]
        assert len(admitted) == 1
        (done,) = admitted
        served[done.tenant] += 1
        admission.observe(Finished(done.request_id, 1, "i0", "ok", 400, 0, 100, 0.1, 0.01, k + 0.5))
        waiting = [r for r in waiting if r is not done]
    assert served["quiet"] >= 9  # about half of the 20 rounds, though it offers 1/6 of the requests


def test_under_share_names_the_tenants_crowded_out_by_weight() -> None:
    assert under_share({"a": 900, "b": 100}, [], {}) == {"b": 500}  # a holds 900 of its 500
    assert under_share({"a": 900, "b": 100}, [], {"a": 9.0}) == {}  # 900 is a's part at weight 9
    assert under_share({"a": 900}, ["b"], {}) == {"b": 450}  # b waits with nothing in flight
    assert under_share({"a": 900}, ["a"], {}) == {}  # one tenant: nobody is crowded out
    assert under_share({"a": 550, "b": 450}, [], {}) == {}  # b is below its part, not crowded out


def test_a_crowded_out_tenants_batch_request_goes_first_and_passes_the_saturated_gate() -> None:
    """The pool is saturated (predicted TTFT 1.5 s) and its batch share full: a batch request
    waits, unless its tenant holds less than its part while another holds more."""
    s, _, router = slomax(predicted=0.1, batch_share=0.0001)
    (big,) = s.submit([req("h0", tenant="heavy", input_tokens=5000)], cluster_view(2), 0.0)
    assert big.action == "admit"  # heavy holds 5 100 tokens in flight, light none
    router.ttft_s = 1.5
    batch = {"task_type": "batch", "deadline": 1e6, "input_tokens": 400}
    offer = [req("h1", tenant="heavy", **batch), req("l1", tenant="light", **batch)]  # type: ignore[arg-type]
    outcomes = {o.request.request_id: o for o in s.submit(offer, cluster_view(2), 1.0)}
    assert outcomes["l1"].action == "admit" and "fair share" in outcomes["l1"].admission_reason
    assert outcomes["h1"].action == "queue"
    # The same offer with nobody above its part: both wait for the pool.
    s, _, _ = slomax(predicted=1.5, batch_share=0.0001)
    assert [o.action for o in s.submit(offer, cluster_view(2), 1.0)] == ["queue", "queue"]


# --- feedback and the controller ------------------------------------------------------------------


def window(
    met: int, finished: int = 100, batch_missed: int = 0, newest: float = 100.0
) -> dict[str, ClassWindow]:
    """One window of outcomes whose newest event is at ``newest``."""
    return {
        "interactive": ClassWindow("interactive", finished=finished, met=met, newest_s=newest),
        "batch": ClassWindow("batch", finished=10, met=10 - batch_missed, newest_s=newest),
    }


def test_the_controller_tightens_on_missed_objectives_and_holds_inside_the_dead_band() -> None:
    c = Controller(knobs=Knobs(0.75, 0.3), default=Knobs(0.75, 0.3))
    step = c.update(window(met=90), 100.0)
    assert step.action == "tighten" and c.knobs.batch_share == pytest.approx(0.24)
    assert c.knobs.headroom == pytest.approx(0.65)
    assert c.update(window(met=985), 110.0).action == "hold"  # 0.985 within [0.98, 0.99)


def test_the_controller_holds_on_stale_or_missing_feedback() -> None:
    c = Controller()
    assert c.update({}, 100.0).action == "stale"
    assert c.update(window(met=50, newest=10.0), 100.0).action == "stale"
    assert c.knobs == Knobs()


def test_a_step_change_of_load_converges_without_oscillation() -> None:
    """Load steps up at t=100: interactive misses while the batch share is over 0.3, batch misses
    deadlines below 0.1. The loop steps the share down, never below what batch needs, and then
    stops: no move for the last windows, and at most one reversal on the way."""
    c = Controller(knobs=Knobs(0.75, 0.6), default=Knobs(0.75, 0.6), dwell=2)
    shares = []
    for k in range(30):
        share = c.knobs.batch_share
        met = 1000 if k < 10 or share <= 0.3 else 900
        misses = 1 if share < 0.1 else 0
        now = 100.0 + 10 * k
        c.update(window(met=met, finished=1000, batch_missed=misses, newest=now), now)
        shares.append(round(c.knobs.batch_share, 4))
    after = shares[10:]
    reversals = sum(1 for a, b, d in zip(after, after[1:], after[2:], strict=False) if (b - a) * (d - b) < 0)
    assert 0.1 <= after[-1] <= 0.3 and reversals <= 1
    assert len(set(after[-10:])) == 1  # settled


def test_in_memory_goodput_windows_count_by_class() -> None:
    g = InMemoryGoodput()
    g.completed(1.0, "interactive", "ok", True, 100, 1)
    g.completed(2.0, "interactive", "timeout", False, 30, 2)
    g.rejected(3.0, "batch")
    w = g.window(10.0, 60.0)
    i = w["interactive"]
    assert (i.finished, i.met, i.output_tokens, i.good_tokens, i.timeouts, i.retries) == (
        2,
        1,
        130,
        100,
        1,
        1,
    )
    assert i.compliant_share == pytest.approx(100 / 130) and w["batch"].rejected == 1
    assert g.window(100.0, 60.0) == {}


def test_prefill_room_follows_the_decode_step_and_the_recent_prefill() -> None:
    load = PrefillLoad(tau_s=4.0, law=(0.01, 0.0, 0.0))  # every decode step takes 10 ms
    view = cluster_view(2)
    # target 0.08 s: tpot = 0.01 / (1 - u) <= 0.08 while u <= 7/8, i.e. 3.5 s of the last 4 s
    ((room, budget),) = load.room(view, 0.0, 0.08)
    assert (room.tolist(), budget.tolist()) == (pytest.approx([3.5, 3.5]), pytest.approx([3.5, 3.5]))
    load.add("i0", 3.0, 0.0)
    ((room, _),) = load.room(view, 0.0, 0.08)
    assert room.tolist() == pytest.approx([0.5, 3.5])
    ((later, _),) = load.room(view, 4.0, 0.08)
    assert later[0] == pytest.approx(3.5 - 3.0 * math.exp(-1.0))  # decays


def test_without_prefill_room_a_request_waits_and_then_goes_where_room_is() -> None:
    s, admission, _ = slomax(predicted=0.3)
    admission.prefill = PrefillLoad(tau_s=4.0, law=(0.08, 0.0, 0.0))  # 80 ms steps: over 0.7 x 0.1 s
    (held,) = s.submit([req("a")], cluster_view(2), 0.0)
    assert held.action == "queue" and "prefill room" in held.reason
    admission.prefill = PrefillLoad(tau_s=4.0, law=(0.01, 0.0, 0.0))
    admission.prefill.add("i1", 10.0, 0.5)  # i1 just took 10 s of prefill: no room there
    (placed,) = s.tick(cluster_view(2), 0.5)
    assert (placed.action, placed.instance_id) == ("admit", "i0")


# --- free when there is room: each gate admits a request that has room --------------------------


def measured_exactly(admission: SloMax, slo_class: str = "interactive", input_tokens: int = 1000) -> None:
    """Feed the error model predictions that were exactly right: its bounds close to (1, 1)."""
    for _ in range(admission.errors.min_samples):
        admission.errors.add(slo_class, input_tokens, 1.0, 1.0)


def test_the_reject_test_uses_the_low_end_of_the_measured_error() -> None:
    s, admission, _ = slomax(predicted=2.5)  # over the 2 s objective by the point prediction
    (kept,) = s.submit([req("a")], cluster_view(2), 0.0)
    assert kept.action != "reject"  # the prior allows a prediction 2x too high: it may still meet it
    measured_exactly(admission)
    (no,) = s.submit([req("b")], cluster_view(2), 0.0)
    assert no.action == "reject" and no.reason.startswith("cannot_meet_slo")


def test_a_request_the_headroom_would_hold_past_its_objective_is_admitted_when_due() -> None:
    s, admission, _ = slomax(predicted=1.8)  # over the 1.3 s headroom gate, within the 2 s objective
    measured_exactly(admission)  # the predictor is known to be right: 1.8 s will be 1.8 s
    (due,) = s.submit([req("a")], cluster_view(2), 0.0)  # 0.25 s more and it would miss: due
    assert due.action == "admit" and "miss its objective" in due.admission_reason


def test_with_several_deciders_a_due_request_no_row_can_meet_at_the_high_end_goes_on_its_prediction() -> None:
    def offered(lane: tuple[int, int]) -> str:
        s, admission, router = slomax(predicted=1.4)  # over the 1.3 s headroom gate, within 2 s
        router.own_s = 0.8  # its own prefill: at 3x, 2.4 s even on an idle instance
        for _ in range(admission.errors.min_samples):  # observed 3x what was predicted
            admission.errors.add("interactive", 1000, 1.0, 3.0)
        s.decide_in_lane(*lane, 0.0)  # (decided at once: no deferral to step through)
        (answer,) = s.submit([req("a")], cluster_view(2), 0.0)
        return answer.action

    assert offered((0, 1)) == "queue"  # one decider: held by the high end (it expires)
    assert offered((0, 2)) == "admit"  # that hold could only expire: its point prediction meets 2 s


def test_a_request_with_the_same_prediction_but_slack_to_spare_is_held_by_the_headroom() -> None:
    s, admission, _ = slomax(predicted=1.4, long_headroom=0.05)
    measured_exactly(admission, "long_context", 40_000)
    (held,) = s.submit([req("a", slo_class="long_context", input_tokens=40_000)], cluster_view(2), 0.0)
    assert held.action == "admit"  # no interactive work waits: the long-prompt headroom yields
    interactive_waiting(s, s.instance_selection, 0.1)  # type: ignore[arg-type]
    (now,) = s.submit([req("b", slo_class="long_context", input_tokens=40_000)], cluster_view(2), 0.1)
    assert now.action == "queue"  # 15 s objective: it can afford to wait for its gate


def test_a_prompt_longer_than_the_prefill_window_is_admitted_on_an_idle_instance() -> None:
    s, _, router = slomax(predicted=6.0)
    router.own_s = 6.0  # 6 s of prefill: more than the 4 s window can ever hold
    (ok,) = s.submit([req("a", input_tokens=120_000)], cluster_view(2), 0.0)
    assert ok.action == "admit"


def test_a_long_prompt_past_its_share_is_admitted_when_no_interactive_work_waits() -> None:
    s, _, _ = slomax(predicted=1.0, long_prefills_per_instance=1, long_share=0.25)  # 1 of 2 instances
    outcomes = s.submit([req(f"l{i}", input_tokens=40_000) for i in range(2)], cluster_view(2), 0.0)
    assert [o.action for o in outcomes] == ["admit", "admit"]


def test_a_due_request_takes_the_prefill_room_left_below_the_tpot_objective_itself() -> None:
    s, admission, router = slomax(predicted=1.0)
    router.own_s = 1.0
    measured_exactly(admission)
    # 80 ms decode steps: no room below 0.7 x 100 ms, 4 x (1 - 0.08 / 0.1) = 0.8 s below 100 ms
    admission.prefill = PrefillLoad(tau_s=4.0, law=(0.08, 0.0, 0.0))
    (held,) = s.submit([req("a")], cluster_view(2), 0.0)
    assert held.action == "queue" and "prefill room" in held.reason  # not due yet: it waits
    (due,) = s.tick(cluster_view(2), 0.8)  # 0.8 + 0.25 + 1.0 > 2 s: it cannot wait again
    assert due.action == "admit" and "miss its objective" in due.admission_reason


def test_the_batch_gate_admits_batch_work_onto_idle_capacity() -> None:
    s, _, _ = slomax(predicted=0.1)
    (ok,) = s.submit([req("b", task_type="batch", deadline=3600.0)], cluster_view(2), 0.0)
    assert ok.action == "admit" and "idle capacity" in ok.admission_reason


# --- several deciders per pool: another decider's placement ----------------------------------


def test_another_deciders_placement_counts_in_quota_shares_and_fairness_until_it_ends() -> None:
    s, admission, _ = slomax(predicted=0.1, tenant_quota_tokens=1500)
    s.observe(Placed(req("a"), "i0", 0.0))  # another decider admitted and placed a (1 100 tokens)
    assert admission.fair.counter("t") == pytest.approx(1000 + 2 * 100)
    (b,) = s.submit([req("b")], cluster_view(2), 0.1)
    assert b.action == "reject" and b.reason.startswith("over_quota")  # as if a were its own
    s.observe(Finished("a", 1, "i0", "ok", 1000, 0, 40, 0.3, 0.02, 1.0))
    (c,) = s.submit([req("c")], cluster_view(2), 1.0)
    assert c.action == "admit"
    assert admission.fair.counter("t") == pytest.approx(2 * (1000 + 2 * 100) - 2 * (100 - 40))


def test_another_deciders_placement_takes_prefill_room_and_the_long_prompt_share() -> None:
    s, admission, router = slomax(predicted=0.3)
    router.own_s = 10.0  # a's prefill, as the router predicts it on its instance
    s.submit([req("warm-up")], cluster_view(2), 0.0)  # the last snapshot offered
    long_prompt = req("a", slo_class="long_context", input_tokens=40_000)
    s.observe(Placed(long_prompt, "i1", 0.4))
    ((room, _),) = admission.prefill.room(cluster_view(2), 0.5, 0.07)
    assert room[1] < 0 < room[0]  # i1 just took 10 s of prefill: no room there
    (placed,) = s.submit([req("b")], cluster_view(2), 0.5)
    assert (placed.action, placed.instance_id) == ("admit", "i0")
    s.observe(FirstToken("a", 1, "i1", 2.0, 2.4))  # its prefill is done: it leaves the share
    assert not admission.in_flight.long_on


def test_an_interactive_request_another_decider_holds_keeps_the_long_prompt_gates_shut() -> None:
    """The long-prompt headroom yields only while no interactive request waits anywhere in the
    pool: one held by another decider counts until its placement is read (then for the calm
    window, as an own hold), or, its end never read, until its objective has passed."""

    def long_prompt(rid: str, now_s: float) -> str:
        long = req(rid, slo_class="long_context", input_tokens=40_000)
        (answer,) = s.submit([long], cluster_view(2), now_s)
        return answer.action

    s, admission, _ = slomax(predicted=1.4, long_headroom=0.05)
    measured_exactly(admission, "long_context", 40_000)
    assert s.wants_holds
    assert long_prompt("a", 0.0) == "admit"  # nothing waits: the headroom yields
    s.observe(HeldElsewhere("x", 1, "interactive", 0.1))  # another decider holds x
    s.observe(HeldElsewhere("y", 1, "long_context", 0.1))  # (only interactive holds count)
    assert long_prompt("b", 0.2) == "queue"
    s.observe(Placed(req("x", arrival=0.1), "i0", 0.6))  # x placed at 0.6: waited until then
    assert long_prompt("c", 4.5) == "queue"  # within the 4 s calm window of its end
    assert long_prompt("d", 4.7) == "admit"
    s.observe(HeldElsewhere("z", 1, "interactive", 5.0))  # its placement never read
    assert long_prompt("e", 6.9) == "queue"
    assert long_prompt("f", 11.1) == "admit"  # 5 + 2 s objective + 4 s window
    s.observe(HeldElsewhere("w", 1, "interactive", 12.0))
    s.submit([req("w", arrival=12.0)], cluster_view(2), 12.1)  # its partition changed hands
    assert not admission.waiting.elsewhere  # offered here: this decider's own hold or admit now


def test_a_decider_leaves_room_for_the_older_holds_of_the_deciders_that_offer_after_it() -> None:
    """Decider k takes a snapshot's room before the deciders of later lanes: a hold of theirs
    that began before its request arrived goes ahead of it (its prompt charged to every row's
    prefill room, as an admit of the same offer); a younger hold, one of an earlier lane, or
    one whose decider is not known does not."""

    def offered_after(lane: int, *held: HeldElsewhere) -> str:
        s, admission, router = slomax(predicted=0.3, prefill_tokens_per_s=1000.0)
        router.own_s = 1.0  # its own prefill: 1 s on either row
        admission.prefill = PrefillLoad(tau_s=4.0, law=(0.01, 0.0, 0.0))  # 3.43 s of room a row
        s.decide_in_lane(lane, 2, 0.0)  # (decided at once: no deferral to step through)
        for event in held:
            s.observe(event)
        (answer,) = s.submit([req("mine", arrival=1.0)], cluster_view(2), 1.0)
        return answer.action

    def hold(time_s: float, lane: int | None) -> HeldElsewhere:
        return HeldElsewhere("x", 1, "interactive", time_s, 6000, lane)  # 6 s: 3 s on each row

    assert offered_after(0) == "admit"
    assert offered_after(0, hold(0.5, lane=1)) == "queue"  # older, offered after this decider
    assert offered_after(0, hold(1.5, lane=1)) == "admit"  # younger
    assert offered_after(1, hold(0.5, lane=0)) == "admit"  # offered before it: had its turn
    assert offered_after(0, hold(0.5, lane=None)) == "admit"
    s, admission, _ = slomax(predicted=0.3)
    s.observe(hold(0.5, lane=1))
    s.observe(Placed(req("x", arrival=0.5), "i0", 0.9))  # placed: no longer waits
    assert not admission.waiting.behind(0, 1.0)


def test_a_placement_read_late_adds_its_prefill_without_rewinding_the_load() -> None:
    load = PrefillLoad(tau_s=4.0, law=(0.01, 0.0, 0.0))
    load.add("i0", 1.0, 4.0)
    load.add("i0", 1.0, 0.0)  # placed at 0, read after the one placed at 4: decayed to 4
    ((room, budget),) = load.room(cluster_view(1), 4.0, 0.08)
    assert budget[0] - room[0] == pytest.approx(1.0 + math.exp(-1.0))
