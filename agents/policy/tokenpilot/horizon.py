"""How long a decode lives on the pool: the horizon H of TokenPilot's decode-harm term.

A decode's time per output token is the mean of its engine steps over its life, so what its
instance may spend prefilling without it missing the TPOT objective is counted over that life
(``room_i = H · (1 - s_i / tpot)`` in the router's docstring). The router never knows a
request's true output length, but it sees every completion: a decode life is the seconds from
a request's first token to its last, ``tpot · (output tokens - 1)``, and

    H = min(cap_s, median of the last ``window`` decode lives)      (cap_s until ``min_samples``)

On a pool of short answers (decode lives of a few tenths of a second) a few prefill steps in a
row are what make a decode miss its TPOT, and a horizon of seconds averages them away. The cap
keeps long answers' horizon short: averaged over a whole long decode, a burst of prefills within
a few seconds looks harmless but is not. Figures: docs/results/scoreboard.md, "How TokenPilot
got here, round by round".
"""

from __future__ import annotations

import numpy as np


class DecodeHorizon:
    def __init__(self, cap_s: float = 4.0, window: int = 256, min_samples: int = 32) -> None:
        self.cap_s = cap_s
        self.min_samples = min_samples
        self._lives = np.zeros(window)
        self._seen = 0
        self.value_s = cap_s

    def add(self, life_s: float) -> None:
        """One completed decode's life (seconds); H is recomputed every ``min_samples`` lives."""
        self._lives[self._seen % len(self._lives)] = life_s
        self._seen += 1
        if self._seen % self.min_samples == 0:
            kept = self._lives[: min(self._seen, len(self._lives))]
            self.value_s = min(self.cap_s, float(np.median(kept)))
