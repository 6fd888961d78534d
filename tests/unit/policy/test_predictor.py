"""The online latency model: recovery, accuracy, robustness, drift, numerics."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.tokenpilot.predictor import OnlineLinearModel

NAMES = ("queued", "prefill_tokens", "prefill_x_context", "running", "tokens_ahead")
# Seconds per unit: per queued request, per uncached prompt token, per prompt x context token
# (attention), per running sequence, per token of work ahead.
TRUE = np.array([0.01, 2.5e-5, 1e-9, 3e-3, 7.6e-8])
PRIOR = TRUE * np.array([2.0, 0.5, 2.0, 0.5, 2.0])  # off by 2x either way
STRONG = [0, 1, 2, 4]  # "running" adds ~3 % of the latency: the weakest, noisiest term


def features(rng: np.random.Generator, n: int) -> np.ndarray:
    def loguniform(lo: float, hi: float) -> np.ndarray:
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))

    return np.column_stack(
        [
            rng.integers(1, 31, n),
            loguniform(1e2, 1e5),
            loguniform(1e7, 1e9),
            rng.integers(1, 31, n),
            loguniform(1e5, 1e7),
        ]
    ).astype(np.float64)


def latencies(rng: np.random.Generator, X: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The true linear latency with 5 % multiplicative noise."""
    return np.asarray((X * theta).sum(axis=1) * (1.0 + 0.05 * rng.standard_normal(len(X))))


def fit(model: OnlineLinearModel, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    for row, target in zip(X, y, strict=True):
        model.update(row, float(target))
    return np.array(list(model.coefficients.values()))


def rel_err(theta: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(theta / truth - 1.0))


def test_recovers_known_coefficients_and_mape() -> None:
    rng = np.random.default_rng(7)
    X = features(rng, 2000)
    y = latencies(rng, X, TRUE)
    model = OnlineLinearModel(NAMES, PRIOR)
    assert model.mape() is None
    theta = fit(model, X, y)
    assert model.count == 2000
    assert list(model.coefficients) == list(NAMES)
    err = rel_err(theta, TRUE)
    assert err[STRONG].max() < 0.04, err
    assert err[3] < 0.08, err
    mape = model.mape()
    assert mape is not None and mape < 0.05  # noise alone: E|5 % N(0,1)| = 4 %


def test_gross_outliers_barely_move_the_fit_but_move_least_squares() -> None:
    rng = np.random.default_rng(11)
    X = features(rng, 2000)
    y = latencies(rng, X, TRUE)
    y[rng.random(len(y)) < 0.05] *= 10.0
    theta = fit(OnlineLinearModel(NAMES, PRIOR), X, y)
    err = rel_err(theta, TRUE)
    assert err[STRONG].max() < 0.04, err
    assert err[3] < 0.08, err
    scale = X.std(axis=0)  # plain least squares, columns scaled for conditioning
    lstsq = np.linalg.lstsq(X / scale, y, rcond=None)[0] / scale
    assert rel_err(lstsq, TRUE).max() > 0.3


def test_forgetting_tracks_a_drift() -> None:
    rng = np.random.default_rng(3)
    new = TRUE * np.array([1.5, 2.0, 1.5, 1.0, 0.6])  # slower prefill, faster decode
    X0, X1 = features(rng, 1500), features(rng, 400)
    y0, y1 = latencies(rng, X0, TRUE), latencies(rng, X1, new)
    # forgetting 0.99: a memory of ~100 samples (the default 0.999 remembers ~1000)
    tracking = OnlineLinearModel(NAMES, TRUE, forgetting=0.99, window=100)
    frozen = OnlineLinearModel(NAMES, TRUE, forgetting=1.0, window=100)
    for model in (tracking, frozen):
        fit(model, X0, y0)
    assert rel_err(np.array(list(tracking.coefficients.values())), TRUE)[STRONG].max() < 0.06
    tracked, stale = fit(tracking, X1, y1), fit(frozen, X1, y1)
    assert rel_err(tracked, new)[STRONG].max() < 0.1
    assert rel_err(stale, new)[STRONG].max() > 0.3
    tracking_mape, frozen_mape = tracking.mape(), frozen.mape()
    assert tracking_mape is not None and frozen_mape is not None
    assert tracking_mape < 0.08
    assert frozen_mape > 0.15


def test_predict_is_vectorised_predict_one() -> None:
    rng = np.random.default_rng(5)
    X = features(rng, 300)
    model = OnlineLinearModel(NAMES, PRIOR)
    fit(model, X[:200], latencies(rng, X[:200], TRUE))
    batch = model.predict(X)
    assert batch.shape == (300,)
    rows = np.array([model.predict_one(row) for row in X])
    np.testing.assert_allclose(batch, rows, rtol=1e-12)
    with pytest.raises(ValueError):
        model.predict(X[:, :4])
    with pytest.raises(ValueError):
        model.predict_one(X[0, :4])


def test_update_returns_the_prediction_before_learning() -> None:
    model = OnlineLinearModel(["a", "b"], [1.0, 2.0])
    x = np.array([3.0, 4.0])
    assert model.update(x, 100.0) == pytest.approx(11.0)
    assert model.mape() == pytest.approx(0.89)
    assert model.predict_one(x) > 11.0  # learnt towards 100


def test_feature_never_seen_keeps_its_prior_then_learns() -> None:
    rng = np.random.default_rng(9)
    X = features(rng, 3000)
    X[:1000, 0] = 0.0  # the queue stays empty at first
    y = latencies(rng, X, TRUE)
    model = OnlineLinearModel(NAMES, PRIOR)
    fit(model, X[:1000], y[:1000])
    assert model.coefficients["queued"] == PRIOR[0]  # no information: untouched, no windup
    theta = fit(model, X[1000:], y[1000:])
    assert rel_err(theta, TRUE)[STRONG].max() < 0.05


def test_coefficients_stay_non_negative() -> None:
    rng = np.random.default_rng(2)
    X = features(rng, 1000)
    truth = TRUE * np.array([1.0, 1.0, 1.0, 0.0, 1.0])  # "running" adds nothing
    y = latencies(rng, X, truth)
    assert min(fit(OnlineLinearModel(NAMES, PRIOR), X, y)) >= 0.0
    free = fit(OnlineLinearModel(NAMES, PRIOR, nonnegative=False), X, y)
    assert np.isfinite(free).all()


def test_bad_samples_are_skipped_and_mape_ignores_non_positive_latency() -> None:
    model = OnlineLinearModel(["a"], [1.0], window=4)
    model.update(np.array([1.0]), float("nan"))
    model.update(np.array([np.inf]), 1.0)
    assert model.count == 0 and model.mape() is None
    model.update(np.array([1.0]), 0.0)  # learnt, but has no percentage error
    assert model.mape() is None
    pred = model.update(np.array([2.0]), 2.0)
    assert model.count == 2
    assert model.mape() == pytest.approx(abs(pred - 2.0) / 2.0)
    with pytest.raises(ValueError):
        OnlineLinearModel(["a", "b"], [1.0])
    with pytest.raises(ValueError):
        OnlineLinearModel(["a"], [1.0], forgetting=0.0)
