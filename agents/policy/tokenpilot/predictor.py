"""Online-calibrated linear latency model (TokenPilot's TTFT predictor).

``y ~ theta . x``, fitted by weighted least squares over exponentially forgotten sufficient
statistics, with Huber down-weighting of outliers, relative-error weighting, a ridge pull towards
a prior and non-negative coefficients. State is O(k^2); ``predict`` is one ``X @ theta``, O(nk).

Update with one sample ``(x, y)`` and the a-priori prediction ``p = theta . x``:

* error scale ``m = max(|y|, c/64)`` (``relative``; ``m = c`` otherwise), ``c`` = running mean
  of ``max(|y|, |p|)``. Weighting the sample by ``(c/m)^2`` makes the fit least squares on
  *relative* errors, which is what MAPE scores (the floor only stops a near-zero ``y`` from
  outweighing thousands of samples). ``m`` comes from the observed ``y``, never from the
  prediction: a model that predicts far too much must learn most from exactly those samples.
* Huber: ``e = |y - p| / m``, ``h = min(1, k sigma / e)``; ``sigma`` = running mean of
  ``min(e, k sigma)`` (clipped, so outliers cannot inflate it).
* statistics, ``g = h (c/m)^2``: ``A <- lambda A + g x x^T``, ``b <- lambda b + g x y``,
  ``W <- lambda W + g``, ``N <- lambda N + 1``.
* fit: in normalised coordinates ``u = theta * s``, ``s_j = max(sqrt(A_jj / W), c/(1024 |prior_j|))``
  (the weighted RMS of feature j — features span ~10 orders of magnitude — but at least the
  value at which the prior's term is 0.1 % of a typical sample: a feature seen only
  in a narrow low range, e.g. a fresh deployment's short prompts, cannot pull its coefficient
  far from the prior, which would then blow up the prediction of the first long prompt by
  orders of magnitude), minimise
  ``u^T A' u - 2 b'^T u + rho |u - u0|^2`` with ``rho = prior_weight (W/N) lambda^n``: the prior
  ``u0 = prior * s`` weighs ``prior_weight`` typical samples, fading as ``n`` samples are learnt.
  Non-negative: coefficients that come out negative are fixed at 0 and the rest re-solved
  (active set). A feature that has only ever been 0 keeps its prior (nothing to learn from).

Re-solving from the statistics each time (rather than propagating an RLS covariance) cannot
diverge: ``theta`` is always the minimiser of a convex objective over the data seen. The solve is
one k x k system, done at every update for the first ``eager`` samples and then every ``every``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from agents.policy.common.numeric import FloatArray

_SIGMA_RATE = 0.02  # adaptation rate of the residual scale sigma
_SIGMA_FLOOR = 1e-9  # in units of e; keeps the Huber test well defined
_RIDGE_FLOOR = 1e-9  # relative ridge that keeps the solve well posed once the prior has faded
_ERROR_FLOOR = 1 / 64  # the error scale m is at least this share of the typical scale c
_REACH_SHARE = 1 / 1024  # see ``s_j`` in the module docstring


class OnlineLinearModel:
    """``y ~ theta . x`` fitted online; see the module docstring for the formulas."""

    def __init__(
        self,
        feature_names: Sequence[str],
        prior: Sequence[float] | FloatArray,
        prior_weight: float = 10.0,
        forgetting: float = 0.999,
        huber_k: float = 3.0,
        window: int = 512,
        nonnegative: bool = True,
        relative: bool = True,
        eager: int = 256,
        every: int = 8,
    ) -> None:
        names = tuple(feature_names)
        theta = np.asarray(prior, dtype=np.float64)
        if theta.shape != (len(names),) or not names:
            raise ValueError("prior must have one value per feature name (at least one)")
        if not np.all(np.isfinite(theta)):
            raise ValueError("prior must be finite")
        if prior_weight <= 0 or not 0 < forgetting <= 1 or huber_k <= 0 or window < 1 or every < 1:
            raise ValueError(
                "need prior_weight > 0, 0 < forgetting <= 1, huber_k > 0, window >= 1, every >= 1"
            )
        self.feature_names = names
        self._k = len(names)
        self._prior = np.maximum(theta, 0.0) if nonnegative else theta.copy()
        # Per unit of the typical scale c: the feature value at which the prior's term is
        # ``_REACH_SHARE`` of a typical sample (0 where the prior is 0).
        magnitude = np.abs(self._prior)
        self._reach = np.divide(_REACH_SHARE, magnitude, out=np.zeros(self._k), where=magnitude > 0)
        self._prior_weight = float(prior_weight)
        self._lambda = float(forgetting)
        self._huber_k = float(huber_k)
        self._nonnegative = nonnegative
        self._relative = relative
        self._eager = eager
        self._every = every
        self._theta = self._prior.copy()
        self._A = np.zeros((self._k, self._k))
        self._b = np.zeros(self._k)
        self._W = 0.0  # forgotten sum of sample weights
        self._N = 0.0  # forgotten sample count
        self._c = 0.0  # running mean of the error scale
        self._sigma: float | None = None
        self._n = 0  # samples learnt
        self._seen = 0  # samples recorded for the MAPE
        self._errors = np.full(window, np.nan)  # ring of |p - y| / y (NaN where y <= 0)

    @property
    def count(self) -> int:
        """Number of samples learnt (finite, and not y = prediction = 0)."""
        return self._n

    @property
    def theta(self) -> FloatArray:
        """Current ``theta`` as an array in feature order (read-only: do not modify)."""
        return self._theta

    @property
    def coefficients(self) -> dict[str, float]:
        """Current ``theta`` by feature name, in raw feature units."""
        return dict(zip(self.feature_names, self._theta.tolist(), strict=True))

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """Predictions for an ``n x k`` matrix (one row per candidate)."""
        Xa = np.asarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != self._k:
            raise ValueError(f"expected an n x {self._k} matrix, got shape {Xa.shape}")
        return Xa @ self._theta

    def predict_one(self, x: npt.ArrayLike) -> float:
        """Prediction for one feature vector of length k."""
        return float(self._vector(x) @ self._theta)

    def mape(self) -> float | None:
        """Mean |pred - y| / y over the last ``window`` updates (y <= 0 ignored); None if none."""
        valid = self._errors[~np.isnan(self._errors)]
        return float(valid.mean()) if valid.size else None

    def update(self, x: npt.ArrayLike, y: float) -> float:
        """Record the current model's error on ``(x, y)``, then learn from it.

        Returns the prediction made before learning. Non-finite samples are not learnt.
        """
        xv = self._vector(x)
        y = float(y)
        pred = float(xv @ self._theta)
        if not (math.isfinite(y) and math.isfinite(pred)):  # pred is NaN/inf if any x is
            return pred
        self._errors[self._seen % self._errors.size] = abs(pred - y) / y if y > 0 else np.nan
        self._seen += 1
        n = self._n + 1
        rate = max(1.0 / n, 1.0 - self._lambda)
        c = self._c + rate * (max(abs(y), abs(pred)) - self._c)
        m = max(abs(y), _ERROR_FLOOR * c) if self._relative else c
        if m <= 0 or c <= 0:  # y = p = 0: nothing to learn from
            return pred
        self._n, self._c = n, c

        e = abs(y - pred) / m
        kk = self._huber_k
        if self._sigma is None:
            self._sigma, h = max(e, _SIGMA_FLOOR), 1.0
        else:
            sigma = self._sigma
            h = 1.0 if e <= kk * sigma else kk * sigma / e
            sigma += max(1.0 / n, _SIGMA_RATE) * (min(e, kk * sigma) - sigma)
            self._sigma = max(sigma, _SIGMA_FLOOR)
        g = h * (c / m) ** 2

        lam = self._lambda
        self._A *= lam
        self._A += g * np.outer(xv, xv)
        self._b *= lam
        self._b += (g * y) * xv
        self._W = lam * self._W + g
        self._N = lam * self._N + 1.0
        if n <= self._eager or n % self._every == 0:
            self._theta = self._solve()
        return pred

    def _solve(self) -> FloatArray:
        """The minimiser of the module docstring's objective, given the statistics so far."""
        seen = np.diag(self._A) > 0
        theta = self._prior.copy()  # features never seen keep their prior
        free = seen.copy()
        scales = np.sqrt(np.diag(self._A)[seen] / self._W)
        s = np.ones(self._k)
        s[seen] = np.maximum(scales, self._reach[seen] * self._c)
        A = self._A / np.outer(s, s)
        b = self._b / s
        u0 = self._prior * s
        rho = self._prior_weight * (self._W / self._N) * self._lambda**self._n
        rho = max(rho, _RIDGE_FLOOR * float(np.trace(A)) / self._k)
        for _ in range(self._k):
            idx = np.flatnonzero(free)
            if idx.size == 0:
                break
            # Fixed coordinates (unseen: prior; clamped: 0) move to the right-hand side.
            fixed = ~free
            u_fixed = np.where(fixed, theta * s, 0.0)
            lhs = A[np.ix_(idx, idx)] + rho * np.eye(idx.size)
            rhs = b[idx] + rho * u0[idx] - A[np.ix_(idx, np.flatnonzero(fixed))] @ u_fixed[fixed]
            u = np.linalg.solve(lhs, rhs)
            theta[idx] = u / s[idx]
            negative = idx[u < 0]
            if not self._nonnegative or negative.size == 0:
                break
            theta[negative] = 0.0
            free[negative] = False
        return theta

    def _vector(self, x: npt.ArrayLike) -> FloatArray:
        xv = np.asarray(x, dtype=np.float64)
        if xv.shape != (self._k,):
            raise ValueError(f"expected a vector of {self._k} features, got shape {xv.shape}")
        return xv
