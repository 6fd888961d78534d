"""SLOMax's measured prediction error: per class and prompt size, with fallbacks."""

from __future__ import annotations

import pytest

from agents.policy.slomax.errors import ErrorBounds, PredictionErrors, size_bucket


def test_buckets_are_powers_of_four_of_the_prompt() -> None:
    assert [size_bucket(n) for n in (100, 4_096, 20_000, 100_000)] == [0, 1, 2, 3]


def test_bounds_come_from_the_bucket_then_the_class_then_the_prior() -> None:
    prior = ErrorBounds(0.5, 1.5)
    errors = PredictionErrors(low_quantile=0.1, high_quantile=0.9, min_samples=10, prior=prior)
    assert errors.bounds("interactive", 1_000) == prior  # nothing measured yet
    for k in range(96):  # short prompts took 0.8x .. 1.18x of their prediction
        errors.add("interactive", 1_000, 1.0, 0.8 + 0.004 * k)
    short = errors.bounds("interactive", 1_000)  # the 10th and 90th percentiles
    assert short.low == pytest.approx(0.838) and short.high == pytest.approx(1.142)
    assert short.late_s == pytest.approx(0.142)
    assert errors.bounds("interactive", 100_000) == short  # no long prompt yet: the class's
    for _ in range(10):  # long prompts took 3x their prediction
        errors.add("interactive", 100_000, 1.0, 3.0)
    assert errors.bounds("interactive", 100_000)[:2] == (1.0, 3.0)  # low never above 1, high never below


def test_unusable_pairs_are_ignored() -> None:
    errors = PredictionErrors(min_samples=1)
    errors.add("interactive", 1_000, 0.0, 1.0)  # no prediction
    errors.add("interactive", 1_000, float("inf"), 1.0)
    assert errors.bounds("interactive", 1_000) == errors.prior


def test_a_short_prediction_is_bounded_by_the_measured_lateness_a_long_one_by_the_ratio() -> None:
    errors = PredictionErrors(high_quantile=0.9, min_samples=10)
    for _ in range(64):  # every first token came 0.1 s after a 1 s prediction
        errors.add("interactive", 1_000, 1.0, 1.1)
    bounds = errors.bounds("interactive", 1_000)
    assert bounds.at_most(0.2) == pytest.approx(0.3)  # not 0.22: fixed costs do not scale down
    assert bounds.at_most(2.0) == pytest.approx(2.2)  # not 2.1: the ratio, above the lateness
    assert bounds.at_least(2.0) == pytest.approx(2.0)
