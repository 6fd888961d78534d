"""Per instance, how much prefill it may still take before its decodes slow past their objective.

Chunked prefill runs a prompt's chunks in the same engine steps as the running decodes, so every
prefill second placed on an instance stretches the time per output token of everything decoding
there. With u_i the share of instance i's recent time that prefill took and step_i its decode
step time, a decode there produces a token about every

    tpot_i ~= step_i / (1 - u_i),    step_i = T0 + c * running_i + d * tokens_in_flight_i

(running and tokens from its heartbeat; T0, c, d a generic H100 7-8B law, the starting point of
TokenPilot's calibration). Keeping tpot_i <= target leaves the instance

    room_i = tau * (1 - step_i / target) - load_i      prefill seconds,

where load_i = sum of the prefill seconds placed on i, each decayed by exp(-age / tau), so
load_i / tau estimates u_i over the last ~tau seconds. SLOMax admits a request only onto rows
with room for its own prefill (and counts what it admitted in one offer against the rows it may
use before the router places it).
"""

from __future__ import annotations

import math

import numpy as np

from agents.policy.common.numeric import FloatArray
from agents.policy.types import ClusterView

DECODE_LAW = (0.01, 4e-5, 8e-8)
"""T0 (s), c (s per running request), d (s per token in flight): one decode step."""


class PrefillLoad:
    def __init__(self, tau_s: float = 4.0, law: tuple[float, float, float] = DECODE_LAW) -> None:
        self.tau_s = tau_s
        self.law = law
        self._load: dict[str, tuple[float, float]] = {}  # instance id -> (load s, as of)

    def add(self, instance_id: str, seconds: float, now_s: float) -> None:
        self._load[instance_id] = (self._decayed(instance_id, now_s) + seconds, now_s)

    def room(self, view: ClusterView, now_s: float, target_s: float) -> FloatArray:
        """Prefill seconds each row of ``view`` can still take (negative: none)."""
        t0, per_seq, per_token = self.law
        step = t0 + per_seq * view.running + per_token * view.tokens_in_flight
        budget = self.tau_s * (1.0 - step / target_s)
        load = np.array([self._decayed(i, now_s) for i in view.instance_ids], dtype=np.float64)
        out: FloatArray = np.where(view.ready, budget - load, -np.inf)
        return out

    def _decayed(self, instance_id: str, now_s: float) -> float:
        load, at = self._load.get(instance_id, (0.0, now_s))
        return load * math.exp(-max(now_s - at, 0.0) / self.tau_s)
