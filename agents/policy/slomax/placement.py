"""Where SLOMax lets a request run: each instance's prefill room, and the long-prompt share.

``PrefillLoad``: per instance, how much prefill it may still take before its decodes slow past
their objective.

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
from collections.abc import Mapping

import numpy as np

from agents.policy.common.numeric import FloatArray
from agents.policy.common.slo import LONG_CONTEXT
from agents.policy.types import BoolArray, ClusterView

DECODE_LAW = (0.01, 4e-5, 8e-8)
"""T0 (s), c (s per running request), d (s per token in flight): one decode step."""


class PrefillLoad:
    def __init__(self, tau_s: float = 4.0, law: tuple[float, float, float] = DECODE_LAW) -> None:
        self.tau_s = tau_s
        self.law = law
        self._load: dict[str, tuple[float, float]] = {}  # instance id -> (load s, as of)

    def add(self, instance_id: str, seconds: float, now_s: float) -> None:
        """``seconds`` of prefill placed on ``instance_id`` at ``now_s``; a placement older than
        the last one there (another decider's, read late) is decayed to that one's time."""
        load, at = self._load.get(instance_id, (0.0, now_s))
        if now_s < at:
            self._load[instance_id] = (load + seconds * math.exp((now_s - at) / self.tau_s), at)
        else:
            self._load[instance_id] = (self._decayed(instance_id, now_s) + seconds, now_s)

    def room(self, view: ClusterView, now_s: float, *targets_s: float) -> list[tuple[FloatArray, FloatArray]]:
        """For each TPOT target, (room, budget) per row of ``view``: the prefill seconds it can
        still take (negative: none), and what it could take with no prefill placed on it lately.
        The decode step and the recent load are computed once for all targets."""
        t0, per_seq, per_token = self.law
        step = t0 + per_seq * view.running + per_token * view.tokens_in_flight
        load = np.array([self._decayed(i, now_s) for i in view.instance_ids], dtype=np.float64)
        rooms = []
        for target_s in targets_s:
            budget = self.tau_s * (1.0 - step / target_s)
            room: FloatArray = np.where(view.ready, budget - load, -np.inf)
            rooms.append((room, budget))
        return rooms

    def _decayed(self, instance_id: str, now_s: float) -> float:
        load, at = self._load.get(instance_id, (0.0, now_s))
        return load * math.exp(-max(now_s - at, 0.0) / self.tau_s)


class Rows:
    """Where the requests of one offer may go: the long-prompt share and each row's prefill room.

    Long prompts prefill on a share of the instances: at most ``max(1, floor(long_share x
    ready))`` at once, each at most ``limit`` of them (placed, no first token yet). A long prompt
    goes to an instance already prefilling long prompts if one has room, else to a new one while
    the share allows, else it waits in its pool. Interactive and batch requests keep off the
    instances prefilling long prompts while another instance has room (work-conserving): a long
    prefill's chunks stall every decode of its instance for seconds.

    Every request needs a row with prefill room for its own prefill (``PrefillLoad`` above),
    capped at half the row's budget: a prefill longer than that (a long prompt of several
    seconds) cannot fit the window at all, yet it stretches its instance's decodes for its whole
    length whatever else is placed there, so it needs half of an idle instance's budget free,
    not more (asking for room it can never get held every 60k+ token prompt until it expired);
    urgent batch work may use any row. The router places what admission let through only after
    it, so an admitted request's prefill is charged evenly to the rows it may use, and one offer
    admits at most one long prompt per instance it may use.
    """

    def __init__(
        self,
        view: ClusterView,
        long_on: Mapping[str, int],
        limit: int,
        long_share: float,
        room: tuple[FloatArray, FloatArray],
        due_room: tuple[FloatArray, FloatArray],
    ) -> None:
        counts = np.zeros(len(view), dtype=np.int64)
        for instance_id, n in long_on.items():
            row = view.index_of.get(instance_id)
            if row is not None:
                counts[row] = n
        busy = view.ready & (counts > 0)
        quiet = view.ready & ~busy
        allowed = max(1, int(long_share * int(view.ready.sum())))
        open_busy = busy & (counts < limit)
        new = max(allowed - int(busy.sum()), 0)  # instances that may start a long prefill
        self._long: BoolArray = open_busy | quiet if new > 0 else open_busy
        self._free = int(open_busy.sum()) + new
        self._quiet: BoolArray | None = quiet if busy.any() and quiet.any() else None
        self.room, self.budget = room
        self.due_room, self.due_budget = due_room

    def long_room(self) -> bool:
        return self._free > 0

    def for_request(
        self, slo_class: str, prefill_s: FloatArray, urgent: bool = False, due: bool = False
    ) -> BoolArray | None:
        """The rows a request of ``slo_class`` may use, ``prefill_s`` its own prefill seconds on
        each row; None: none has room (it waits). ``due``: judged by ``due_room`` (the room
        below the TPOT objective itself) instead of ``room`` (below its headroom)."""
        room, budget = (self.due_room, self.due_budget) if due else (self.room, self.budget)
        need = np.minimum(prefill_s, 0.5 * budget)
        fits: BoolArray = np.isfinite(room) if urgent else room >= need
        share = self._long if slo_class == LONG_CONTEXT else self._quiet
        if share is not None:
            both = fits & share
            if both.any() or slo_class == LONG_CONTEXT:
                return both if both.any() else None
        return fits if fits.any() else None

    def taken(self, slo_class: str, rows: BoolArray | None, prefill_s: float) -> None:
        if slo_class == LONG_CONTEXT:
            self._free -= 1
        if rows is not None and rows.any():
            share = prefill_s / int(rows.sum())
            self.room[rows] -= share
            self.due_room[rows] -= share
