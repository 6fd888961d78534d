"""The step clock: when the step in progress on each instance ends (TokenPilot's boundary wait).

A request sent to a busy instance waits for the engine step in progress to end before its own
prefill step starts. The router sees step boundaries: a first token and the end of a response
(status ok) are both emitted at the end of the engine step that produced them. Per instance the
clock keeps the last boundary seen, ``t_i``. While nothing has been sent there since ``t_i`` and
every request sent there has had its first token (no prefill can be in progress, so every step
since ``t_i`` is a decode step), the steps since ``t_i`` all last about one decode step ``s_i``,
and the wait for the next boundary is

    w_i = s_i - ((now - t_i) mod s_i)

as long as ``t_i`` is at most ``phase_steps`` steps old (each step's error shifts the phase).
Otherwise the phase is unknown and ``w_i = lost_share · s_i`` (the expected wait of a uniform
phase is half a step). An idle instance has ``w_i = 0``.

``s_i`` is the router's decode-step law ``T0 + c·B_i + d·C_i`` (its θ) times a per-profile
``scale``: θ is calibrated on first-token times, which hold part of a wait, so its step is not
the engine's. The scale is learnt from the gaps between consecutive boundaries of an instance
that ran decode steps only in between (the end of a response with nothing sent since the last
boundary and no first token outstanding): each such gap is k >= 1 steps, so the gaps over the
predicted step cluster at k · scale; ``scale`` is a low quantile of the recent ones (none is
less than one step).

Known weakness: where boundaries are sparse (long answers, few per step: Mooncake) one-step gaps
are rare and the quantile lands on several steps; the phase is then almost never known anyway
(the last boundary is tens of steps old), so the wait is ``lost_share · s_i`` and its
coefficient absorbs the error. Counting only the gaps of about one scaled step would fix the
scale there but bias it low where boundaries are dense. What the clock buys:
docs/results/scoreboard.md, "How TokenPilot got here, round by round".
"""

from __future__ import annotations

from collections import deque

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray, IntArray
from agents.policy.common.slots import SlotRegistry
from agents.policy.tokenpilot import kernels
from agents.policy.types import ClusterView

_SAME_STEP_S = 1e-9  # boundaries closer than this are the same step end


class StepClock:
    def __init__(
        self,
        phase_steps: float = 2.0,
        lost_share: float = 0.5,
        quantile: float = 0.1,
        window: int = 256,
        min_gaps: int = 32,
    ) -> None:
        self.phase_steps = phase_steps
        self.lost_share = lost_share
        self.quantile = quantile
        self.min_gaps = min_gaps
        self._window = window
        self._profile: list[str] = []  # by slot
        self._version = -1  # the snapshot every row of which has a slot
        self._slot_of_row = np.zeros(0, dtype=np.int64)  # of that snapshot
        self._instance_ids: tuple[str, ...] = ()  # its rows, all with a slot
        # By slot (every instance of a view gets one, in row order: slots are then its rows).
        self._slots = SlotRegistry(
            {
                "boundary_s": (-np.inf, np.float64),  # last step boundary seen
                "sent_s": (-np.inf, np.float64),  # last send
                "awaiting": (0, np.int64),  # sends without a first token yet
                "touched": (False, np.bool_),  # ever sent to
                "step_s": (0.0, np.float64),  # the last predicted (unscaled) decode step
            }
        )
        self._pending: dict[tuple[str, int], int] = {}  # request key -> slot, until first token
        self._gaps: dict[str, deque[float]] = {}
        self._scale: dict[str, float] = {}
        self._new_gaps: dict[str, int] = {}

    def scale(self, profile: str) -> float:
        """The engine's decode step over θ's, learnt for ``profile`` (1 until enough gaps)."""
        return self._scale.get(profile, 1.0)

    # --- events ---------------------------------------------------------------------------------

    def sent(self, instance_id: str, profile: str, key: tuple[str, int], now_s: float) -> None:
        slot = self._slot(instance_id, profile)
        c = self._slots.columns
        sent = c["sent_s"]
        if now_s > sent[slot]:
            sent[slot] = now_s
        c["awaiting"][slot] += 1
        c["touched"][slot] = True
        self._pending[key] = slot

    def first_token(self, key: tuple[str, int], instance_id: str, time_s: float) -> None:
        self._settle(key)
        slot = self._slots.get(instance_id)
        if slot is not None:
            boundary = self._slots.columns["boundary_s"]
            boundary[slot] = max(boundary[slot], time_s)

    def finished(self, key: tuple[str, int], instance_id: str, time_s: float, ok: bool) -> None:
        self._settle(key)
        slot = self._slots.get(instance_id)
        if slot is None or not ok:  # an abort or a timeout is no step end
            return
        c = self._slots.columns
        last = c["boundary_s"][slot]
        gap = time_s - last
        if (
            gap > _SAME_STEP_S
            and np.isfinite(last)
            and c["sent_s"][slot] <= last
            and c["awaiting"][slot] == 0
            and c["step_s"][slot] > 0
        ):
            self._add_gap(self._profile[slot], gap / c["step_s"][slot])
        c["boundary_s"][slot] = max(last, time_s)

    def _settle(self, key: tuple[str, int]) -> None:
        slot = self._pending.pop(key, None)
        if slot is not None:
            self._slots.columns["awaiting"][slot] -= 1

    def _add_gap(self, profile: str, ratio: float) -> None:
        gaps = self._gaps.get(profile)
        if gaps is None:
            gaps = self._gaps[profile] = deque(maxlen=self._window)
        gaps.append(ratio)
        fresh = self._new_gaps.get(profile, 0) + 1
        if len(gaps) >= self.min_gaps and fresh >= 8:
            self._scale[profile] = float(np.quantile(np.fromiter(gaps, float), self.quantile))
            fresh = 0
        self._new_gaps[profile] = fresh

    # --- the wait -------------------------------------------------------------------------------

    def wait(
        self,
        view: ClusterView,
        now_s: float,
        open_requests: IntArray,
        batch: IntArray | FloatArray,
        step_s: FloatArray,
        scale: FloatArray,
    ) -> FloatArray:
        """Seconds to the next step boundary per row. Busy rows: the router's own requests still
        open there (exact where it sends all of an instance's traffic: a stale heartbeat would
        call an instance busy that has drained since), or the heartbeat's ``batch`` on one it
        never sent to. ``step_s``: the unscaled predicted decode step per row (recorded for the
        gaps), ``scale`` its per-row scale. The formula per row: ``kernels.boundary_wait``."""
        slot_of_row, boundary_s, sent_s, awaiting, touched, step_by_slot = self.columns(view)
        wait = np.empty(len(view))
        kernels.boundary_wait(
            float(now_s),
            float(self.phase_steps),
            float(self.lost_share),
            np.asarray(open_requests, dtype=np.int64),
            np.asarray(batch, dtype=np.float64),
            np.asarray(step_s, dtype=np.float64),
            np.asarray(scale, dtype=np.float64),
            slot_of_row,
            boundary_s,
            sent_s,
            awaiting,
            touched,
            step_by_slot,
            wait,
        )
        return wait

    def columns(
        self, view: ClusterView
    ) -> tuple[IntArray, FloatArray, FloatArray, IntArray, BoolArray, FloatArray]:
        """What ``wait`` reads, for a caller that computes it in its own kernel
        (``kernels.row_features``): each row's slot, and by slot the last boundary, the last
        send, the sends awaiting a first token, whether ever sent to, and the decode step (the
        caller writes it, as ``wait`` records it for the gaps). Every row of ``view`` gets a slot."""
        n = len(view)
        if self._version != view.version:
            ids = view.instance_ids
            if ids is not self._instance_ids and ids != self._instance_ids:  # (else: all have slots)
                for instance_id, profile in zip(ids, view.profile.tolist(), strict=True):
                    self._slot(instance_id, profile)
                self._instance_ids = ids
            slots, rows = self._slots.rows(view)
            if self._slots.identity:  # slot s is row s (the usual case)
                self._slot_of_row = np.arange(n, dtype=np.int64)
            else:
                self._slot_of_row = np.empty(n, dtype=np.int64)
                self._slot_of_row[rows] = slots
            self._version = view.version
        c = self._slots.columns
        return self._slot_of_row, c["boundary_s"], c["sent_s"], c["awaiting"], c["touched"], c["step_s"]

    def _slot(self, instance_id: str, profile: str) -> int:
        slot = self._slots.get(instance_id)
        if slot is None:
            slot = self._slots.slot(instance_id)
            self._profile.append(profile)
        return slot
