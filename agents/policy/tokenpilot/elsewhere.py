"""Several deciders per pool: what TokenPilot (``router.py``) does with another decider's
placement, as the ``PlacedElsewhere`` mixin of ``TokenPilot``.

Another decider's placement (``Placed``, from the decision log) is recorded as an own send
(``_placed_elsewhere``), due at its decider's predicted TTFT (taken, not computed: cheaper)
stretched by its size's lateness: queues drained to when it was placed, its uncached tokens and
pairs queued on its instance, the send counted by the step clock, its blocks credited in the
prefix index; its first token and end clip the queue as an own send's do and calibrate nothing
(learning from the others' sends hurts: docs/results/scoreboard.md). Without a prediction
(another policy decided it) its features are computed on this router's last snapshot; with no
snapshot yet it only credits the prefix and counts in flight. The drain cannot run backwards: a
placement read after a later decision joins the queue drained to that decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agents.policy.tokenpilot.features import FEATURES, PREFILL_PAIRS, PREFILL_TOKENS
from agents.policy.tokenpilot.sends import Sent
from agents.policy.types import BLOCK_TOKENS, ClusterView, Placed

if TYPE_CHECKING:
    from agents.policy.common.inflight import InFlight
    from agents.policy.common.numeric import FloatArray, IntArray
    from agents.policy.common.prefix_index import PrefixIndex
    from agents.policy.tokenpilot.lateness import PrefillLateness
    from agents.policy.tokenpilot.predictor import OnlineLinearModel
    from agents.policy.tokenpilot.queues import PrefillQueues
    from agents.policy.tokenpilot.snapshot import Fixed, RowFeatures, ViewRows
    from agents.policy.tokenpilot.stepclock import StepClock
    from agents.policy.types import RequestView

_NO_FEATURES = np.zeros(len(FEATURES))  # of another decider's send: it calibrates nothing here
_NO_FEATURES.flags.writeable = False


class PlacedElsewhere:
    """Another decider's placements in ``TokenPilot`` (module docstring). It holds no state of
    its own: it reads and records the router's, declared below for the type checker."""

    if TYPE_CHECKING:  # ``TokenPilot``'s (and ``InstanceSelector``'s ``in_flight``)
        index: PrefixIndex
        in_flight: InFlight
        clock: StepClock
        queues: PrefillQueues
        lateness: PrefillLateness
        _sent: dict[tuple[str, int], Sent]
        _last_queued: dict[str, tuple[str, int]]
        _last_view: ClusterView | None

        def model_for(self, profile: str) -> OnlineLinearModel: ...
        def _fixed_for(self, view: ClusterView) -> Fixed: ...
        def _features(self, request: RequestView, view: ClusterView, now_s: float) -> RowFeatures: ...
        def _queued(
            self,
            view: ClusterView,
            now_s: float,
            sent: IntArray,
            sent_tokens: IntArray,
            at: ViewRows,
            thetas: FloatArray,
        ) -> tuple[FloatArray, FloatArray]: ...

    def _placed_elsewhere(self, event: Placed) -> None:
        """Record another decider's placement as an own send (module docstring); called before
        it joins ``in_flight``, so the queues and the step clock are as its decider saw them."""
        request, instance_id = event.request, event.instance_id
        view = self._last_view
        row = None if view is None else view.index_of.get(instance_id)
        if view is not None and row is not None:
            profile = str(view.profile[row])
            theta = self.model_for(profile).theta
            if event.predicted_ttft_s is None:  # its decider made no prediction: ours, on our view
                rows = self._features(request, view, event.time_s)
                tokens, pairs = float(rows.new[row]), float(rows.pairs[row])
                predicted = float(rows.features[row] @ theta)
            else:
                self._queued_at(view, event.time_s)
                matched = self.index.leading_held(instance_id, request.block_hashes)
                cached = float(min(matched * BLOCK_TOKENS, request.input_tokens - 1))
                tokens = request.input_tokens - cached
                pairs = tokens * (cached + tokens * 0.5)
                predicted = event.predicted_ttft_s
            lateness = self.lateness.of(tokens)
            due_s = event.time_s + predicted * lateness
            prefill_s = (tokens * theta[PREFILL_TOKENS] + pairs * theta[PREFILL_PAIRS]) * lateness
            key = request.key
            self.clock.sent(instance_id, profile, key, event.time_s)
            mark = self.queues.add(row, tokens, pairs, prefill_s, key, due_s, event.time_s, own=False)
            self._sent[key] = Sent(
                instance_id, profile, _NO_FEATURES, tokens, pairs, predicted, due_s, False, mark, own=False
            )
            self._last_queued[instance_id] = key
        self.index.add(instance_id, request.block_hashes)

    def _queued_at(self, view: ClusterView, now_s: float) -> None:
        """Drain the queues to ``now_s`` on ``view`` (what ``_features`` does first)."""
        if self.queues.aligned_to(view) and self.queues.drained_to(now_s):
            return  # (another decider's placement read after this one's own decisions: usual)
        sent, sent_tokens = self.in_flight.since_heartbeat(view)
        fixed = self._fixed_for(view)
        self._queued(view, now_s, sent, sent_tokens, fixed.rows, fixed.thetas)
