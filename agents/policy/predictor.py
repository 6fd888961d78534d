"""Online-calibrated linear latency model (TokenPilot's TTFT predictor).

``y ~ theta . x``, fitted by recursive least squares (RLS) with exponential forgetting ``lambda``,
Huber down-weighting of outliers and (by default) relative-error weighting. State is O(k^2); an
update is a fixed handful of O(k^2) numpy operations; ``predict`` is one ``X @ theta``, O(nk).

Update with one sample ``(x, y)`` and the a-priori prediction ``p = theta . x``:

* error scale ``m = max(|p|, |y|/4)`` (``relative``; ``m = c`` otherwise), ``c`` = running mean
  of ``m`` (of ``|y|`` if not relative). Weighting the sample by ``(c/m)^2`` makes the fit least
  squares on *relative* errors, which is what MAPE scores; ``m`` depends on ``y`` only when
  ``y > 4p``, so multiplicative noise does not bias it.
* Huber: ``e = |y - p| / m``, ``h = min(1, k sigma / e)``; ``sigma`` = running mean of
  ``min(e, k sigma)`` (clipped, so outliers cannot inflate it).
* normalised coordinates: features span ~10 orders of magnitude (counts ~1, tokens ~1e5,
  token products ~1e9), so RLS runs on ``z = sqrt(h) u / s`` with ``u = (c/m) x`` and ``s`` the
  running RMS of ``u`` (1 while a feature has only been 0), and on ``w = theta * s`` (a feature's
  contribution at its typical size). When ``s`` changes to ``s'`` the state is reparametrised
  exactly, ``w <- D w``, ``P <- D P D``, ``D = diag(s'/s)``: scaling affects conditioning only.
* RLS: ``K = P z / (lambda + z^T P z)``, ``w <- w + K sqrt(h) (c/m) (y - p)``,
  ``P <- (P - K z^T P) / lambda``, then symmetrised; ``w <- max(w, 0)`` if ``nonnegative``.

Prior: ``theta = prior`` and ``P = I / prior_weight`` in normalised coordinates, set per feature
when it is first non-zero (its scale is known from then on). A sample adds ``z z^T`` with
``|z_j| ~ 1`` to the information matrix, so the prior weighs about ``prior_weight`` samples in
every feature, a soft pull that forgetting fades after ~``1/(1 - lambda)`` samples.
Anti-windup: forgetting inflates the variance of directions no data excites without bound; a
feature whose variance ``P_jj`` exceeds the prior's ``1/prior_weight`` is exempt from the
``1/lambda`` inflation (its row and column are scaled back by ``sqrt(lambda)``).
Running means use the rate ``max(1/n, 1 - lambda)`` (``c``, ``s``) and ``max(1/n, 0.02)``
(``sigma``, fast enough to follow a drift), ``n`` = samples learnt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

_SIGMA_RATE = 0.02  # adaptation rate of the residual scale sigma
_SIGMA_FLOOR = 1e-9  # in units of e; keeps the Huber test well defined


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
    ) -> None:
        names = tuple(feature_names)
        theta = np.asarray(prior, dtype=np.float64)
        if theta.shape != (len(names),) or not names:
            raise ValueError("prior must have one value per feature name (at least one)")
        if not np.all(np.isfinite(theta)):
            raise ValueError("prior must be finite")
        if prior_weight <= 0 or not 0 < forgetting <= 1 or huber_k <= 0 or window < 1:
            raise ValueError("need prior_weight > 0, 0 < forgetting <= 1, huber_k > 0, window >= 1")
        self.feature_names = names
        self._k = len(names)
        self._prior_weight = float(prior_weight)
        self._lambda = float(forgetting)
        self._huber_k = float(huber_k)
        self._nonnegative = nonnegative
        self._relative = relative
        self._theta = np.maximum(theta, 0.0) if nonnegative else theta.copy()
        self._s = np.ones(self._k)  # feature scales
        self._ms = np.zeros(self._k)  # running mean of u^2
        self._w = self._theta.copy()  # theta * s
        self._P = np.eye(self._k) / self._prior_weight
        self._c = 0.0  # running mean of the error scale m
        self._sigma: float | None = None
        self._n = 0  # samples learnt
        self._seen = 0  # samples recorded for the MAPE
        self._errors = np.full(window, np.nan)  # ring of |p - y| / y (NaN where y <= 0)

    @property
    def count(self) -> int:
        """Number of samples learnt (finite, and not y = prediction = 0)."""
        return self._n

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
        size = max(abs(pred), abs(y) / 4.0) if self._relative else abs(y)
        c = self._c + rate * (size - self._c)
        m = size if self._relative else c
        if m <= 0 or c <= 0:  # y = p = 0: nothing to learn from
            return pred
        self._n, self._c = n, c

        # Feature scales from the weighted features u = (c/m) x; exact reparametrisation of (w, P).
        u = (c / m) * xv
        fresh = self._ms == 0
        self._ms += rate * (u * u - self._ms)
        scales = np.sqrt(self._ms)
        scales[scales <= 0] = 1.0
        d = scales / self._s
        self._w *= d
        self._P *= np.outer(d, d)
        fresh &= self._ms > 0
        if fresh.any():  # first non-zero value: no information yet, (re)start from the prior
            self._P[fresh, :] = 0.0
            self._P[:, fresh] = 0.0
            idx = np.flatnonzero(fresh)
            self._P[idx, idx] = 1.0 / self._prior_weight
        self._s = scales

        # Huber weight on the scaled residual e, against its running scale sigma.
        e = abs(y - pred) / m
        kk = self._huber_k
        if self._sigma is None:
            self._sigma, h = max(e, _SIGMA_FLOOR), 1.0
        else:
            sigma = self._sigma
            h = 1.0 if e <= kk * sigma else kk * sigma / e
            sigma += max(1.0 / n, _SIGMA_RATE) * (min(e, kk * sigma) - sigma)
            self._sigma = max(sigma, _SIGMA_FLOOR)
        g = math.sqrt(h) * c / m  # square root of the sample weight

        # Weighted RLS step with forgetting, in normalised coordinates.
        z = (g / scales) * xv  # = sqrt(h) u / s
        P = self._P
        Pz = P @ z
        gain = Pz / (self._lambda + float(z @ Pz))
        self._w += gain * (g * (y - pred))
        P -= np.outer(gain, Pz)
        P += P.T
        P *= 0.5 / self._lambda
        # Anti-windup: forgetting is suspended for features (rows/columns) without excitation,
        # once their variance exceeds the prior's 1/prior_weight (undo the 1/lambda inflation).
        over = np.diag(P) > 1.0 / self._prior_weight
        if self._lambda < 1.0 and over.any():
            undo = np.where(over, math.sqrt(self._lambda), 1.0)
            P *= np.outer(undo, undo)
        if self._nonnegative:
            np.maximum(self._w, 0.0, out=self._w)
        self._theta = self._w / scales
        return pred

    def _vector(self, x: npt.ArrayLike) -> FloatArray:
        xv = np.asarray(x, dtype=np.float64)
        if xv.shape != (self._k,):
            raise ValueError(f"expected a vector of {self._k} features, got shape {xv.shape}")
        return xv
