"""SLOMax's measured prediction error: per class and prompt size, with fallbacks."""

from __future__ import annotations

import pytest

from agents.policy.slomax.errors import PredictionErrors, size_bucket


def test_buckets_are_powers_of_four_of_the_prompt() -> None:
    assert [size_bucket(n) for n in (100, 4_096, 20_000, 100_000)] == [0, 1, 2, 3]


def test_bounds_come_from_the_bucket_then_the_class_then_the_prior() -> None:
    errors = PredictionErrors(low_quantile=0.1, high_quantile=0.9, min_samples=10, prior=(0.5, 1.5))
    assert errors.bounds("interactive", 1_000) == (0.5, 1.5)  # nothing measured yet
    for k in range(96):  # short prompts took 0.8x .. 1.18x of their prediction
        errors.add("interactive", 1_000, 1.0, 0.8 + 0.004 * k)
    low, high = errors.bounds("interactive", 1_000)  # the 10th and 90th percentiles
    assert low == pytest.approx(0.838) and high == pytest.approx(1.142)
    assert errors.bounds("interactive", 100_000) == (low, high)  # no long prompt yet: the class's
    for _ in range(10):  # long prompts took 3x their prediction
        errors.add("interactive", 100_000, 1.0, 3.0)
    assert errors.bounds("interactive", 100_000) == (1.0, 3.0)  # low never above 1, high never below


def test_unusable_pairs_are_ignored() -> None:
    errors = PredictionErrors(min_samples=1)
    errors.add("interactive", 1_000, 0.0, 1.0)  # no prediction
    errors.add("interactive", 1_000, float("inf"), 1.0)
    assert errors.bounds("interactive", 1_000) == errors.prior
