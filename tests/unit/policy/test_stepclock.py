"""The step clock: the wait for the engine step in progress, from the boundaries the router sees."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.tokenpilot.stepclock import StepClock
from tests.unit.policy.helpers import cluster_view

OPEN = np.array([1, 0])  # the router's own requests still open on i0, i1
BATCH = np.array([3, 3])  # running there, by the heartbeat (i1 never got a request of ours)
STEP = np.array([0.1, 0.1])
UNSCALED = np.array([1.0, 1.0])


def clock_with_boundary(at_s: float) -> StepClock:
    """i0 got one request, whose first token ended a step at ``at_s``; i1 never got any."""
    clock = StepClock(phase_steps=2.0, lost_share=0.5)
    clock.sent("i0", "p", ("a", 1), at_s - 1.0)
    clock.first_token(("a", 1), "i0", at_s)
    return clock


def test_the_wait_is_what_is_left_of_the_step_in_progress_while_its_phase_is_known() -> None:
    clock = clock_with_boundary(10.0)
    wait = clock.wait(cluster_view(2), 10.13, OPEN, BATCH, STEP, UNSCALED)
    assert wait[0] == pytest.approx(0.07)  # a step ended at 10.0 and at 10.1: the next at 10.2
    assert wait[1] == pytest.approx(0.05)  # no boundary ever seen: half a step, expected


def test_the_phase_is_lost_after_a_send_after_a_few_steps_and_idle_waits_for_nothing() -> None:
    clock = clock_with_boundary(10.0)
    assert clock.wait(cluster_view(2), 10.25, OPEN, BATCH, STEP, UNSCALED)[0] == pytest.approx(
        0.05
    )  # 2.5 steps
    clock.sent("i0", "p", ("b", 1), 10.01)  # its prefill may be in the step now: any length
    assert clock.wait(cluster_view(2), 10.03, OPEN, BATCH, STEP, UNSCALED)[0] == pytest.approx(0.05)
    # i0: every request of ours there ended (its stale heartbeat still says 3); i1: empty
    drained, beat = np.array([0, 0]), np.array([3, 0])
    assert (clock.wait(cluster_view(2), 10.03, drained, beat, STEP, UNSCALED) == 0).all()


def test_the_scale_is_learnt_from_gaps_between_decode_only_boundaries() -> None:
    # θ's step is 0.05 s; the engine's is 0.1 s: ends of responses come 1, 2 or 3 real steps
    # apart, so the low quantile of gap / θ-step is 2.
    clock = clock_with_boundary(0.0)
    view = cluster_view(2)
    clock.wait(view, 0.0, OPEN, BATCH, np.array([0.05, 0.05]), UNSCALED)  # records θ's step per instance
    assert clock.scale("p") == 1.0
    t = 0.0
    for k in range(64):
        t += 0.1 * (1 + k % 3)
        clock.finished(("old", k), "i0", t, ok=True)
    assert clock.scale("p") == pytest.approx(2.0)
    clock.finished(("gone", 1), "i0", t + 0.37, ok=False)  # an abort is no step end
    assert clock.wait(view, t + 0.02, OPEN, BATCH, STEP, np.array([2.0, 2.0]))[0] == pytest.approx(0.18)
