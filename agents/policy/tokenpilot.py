"""TokenPilot: pick the instance with the lowest *predicted* time to first token.

For a request with ``input`` prompt tokens on candidate instance i:

    cached_i  = prompt tokens instance i holds (prefix index: own routing + KV events)
    P_i       = input - cached_i                  uncached tokens to prefill
    backlog_i = max(busy_until_i - now, 0)        seconds of prefill queued ahead on i
    steps_i   = ceil(P_i / prefill_budget)        engine steps of the request's own prefill
    B_i, C_i  = requests and their context tokens on i (heartbeat + own sends since)
    pairs_i   = token pairs of attention in the own prefill: P_i·(cached_i + P_i/2)
    waiting_i = requests waiting on i (heartbeat + own sends since): seats or KV blocking
    short_i   = KV blocks the request needs (prompt + output budget, less its cached prefix)
                beyond what i has free (heartbeat, less blocks of own sends since): it waits
                for running requests to finish and free them

    TTFT_i ≈ θ · [backlog_i, steps_i, steps_i·B_i, steps_i·C_i, P_i, pairs_i, waiting_i, short_i]

Prefill is FCFS inside the engine, so a request's first token comes once everything queued ahead
of it is prefilled, plus its own prefill under the engine's step-time law (T0, c, d per step;
a, b per prefill token and token pair). The router sends every request of the pool, so it keeps
the queue ahead itself, in seconds: ``busy_until_i`` is the predicted first-token time of the
last request it sent to i (``now + TTFT_i`` at that decision), pulled back when a request still
queued there is aborted. The backlog then drains continuously with time, as the engine's does.

θ is not hand-tuned: one ``OnlineLinearModel`` per engine profile is calibrated online from
completions (the features recorded at decision time against the TTFT the completion reports),
so a heterogeneous pool is compared in seconds, not counts.

A cache-warm but busy instance wins only when the prefill it saves outweighs the queue ahead;
a burst cannot pile onto one instance because each decision immediately extends that
instance's backlog and in-flight counts, and near-ties are broken at random.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.policy.base import BoolArray, FloatArray, Pick, RoutingPolicy, blocks_for
from agents.policy.predictor import OnlineLinearModel
from agents.policy.prefix_index import PrefixIndex
from agents.policy.types import BLOCK_TOKENS, ClusterView, Completion, KvEvent, RequestView

FEATURES = (
    "backlog_s",
    "steps",
    "steps_x_batch",
    "steps_x_context",
    "prefill_tokens",
    "prefill_pairs",
    "waiting",
    "kv_shortfall_blocks",
)
_WAIT_TERMS = [0, 6, 7]  # backlog_s, waiting, kv_shortfall_blocks
PRIOR = (1.0, 0.01, 4e-5, 8e-8, 3e-5, 1.5e-9, 0.05, 0.01)
"""A generic H100 7-8B engine, as a soft starting point; calibration replaces it within minutes."""


@dataclass(slots=True)
class _Sent:
    instance_id: str
    profile: str
    features: np.ndarray
    starts_s: float  # predicted start of its own prefill (end of the backlog ahead)
    due_s: float  # predicted first token


class TokenPilot(RoutingPolicy):
    name = "tokenpilot"
    wants_kv_events = True

    def __init__(self, seed: int = 0, prefill_budget: int = 8192, tie_tolerance: float = 0.02) -> None:
        super().__init__(seed)
        self.prefill_budget = prefill_budget
        self.tie_tolerance = tie_tolerance
        self.spare_others = 1.0
        self.index = PrefixIndex()
        self.models: dict[str, OnlineLinearModel] = {}
        self._busy_until: dict[str, float] = {}
        self._busy_rows = np.zeros(0)  # _busy_until aligned with the rows of _aligned_to
        self._aligned_to: ClusterView | None = None
        self._sent: dict[tuple[str, int], _Sent] = {}
        self._chosen: tuple[float, FloatArray, float] = (0.0, np.zeros(len(FEATURES)), 0.0)  # now, x, own s

    # --- deciding -----------------------------------------------------------------------------

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        self.index.size_like(view)
        features = self.features(request, view, now_s)
        predicted = np.full(len(view), np.inf)
        for profile in set(view.profile[mask].tolist()):
            rows = mask & (view.profile == profile)
            predicted[rows] = self.model_for(profile).predict(features[rows])
        score = predicted + self.spare_others * self._delay_to_others(request, features, view)
        row = self._pick_near_min(score, mask)
        self._chosen = (now_s, features[row], self._own_prefill_s(str(view.profile[row]), features[row]))
        return Pick(row, "min predicted TTFT", float(predicted[row]))

    def features(self, request: RequestView, view: ClusterView, now_s: float) -> FloatArray:
        """The model's features of ``request`` on every row of ``view`` (n x len(FEATURES))."""
        matched = self.index.match_array(request.block_hashes, view.index_of, len(view))
        cached = np.minimum(matched * BLOCK_TOKENS, request.input_tokens - 1).astype(np.float64)
        new = request.input_tokens - cached
        steps = np.ceil(new / self.prefill_budget)
        sent, sent_tokens = self.in_flight.since_heartbeat(view)
        batch = (view.running + sent).astype(np.float64)
        context = (view.tokens_in_flight + sent_tokens).astype(np.float64)
        waiting = (view.waiting + sent).astype(np.float64)
        pairs = new * (cached + new / 2)
        need = blocks_for(request.input_tokens + request.output_budget) - matched
        # Reservations of own sends the heartbeat does not show yet (their budgets taken as ours).
        unseen = (sent_tokens + sent * request.output_budget) / BLOCK_TOKENS
        free = view.kv_total - view.kv_used - unseen
        shortfall = np.maximum(need - free, 0).astype(np.float64)
        backlog = np.maximum(self._busy_rows_for(view) - now_s, 0.0)
        return np.column_stack(
            [backlog, steps, steps * batch, steps * context, new, pairs, waiting, shortfall]
        )

    def _delay_to_others(self, request: RequestView, features: FloatArray, view: ClusterView) -> FloatArray:
        """Seconds the request's first prefill chunk adds to the step of the request queued last
        on each row (chunked prefill runs them in one step, so its first token waits for ours)."""
        new = features[:, 4]
        chunk = np.minimum(new, self.prefill_budget)
        cached = request.input_tokens - new
        pairs = chunk * (cached + chunk / 2)
        delay = np.zeros(len(view))
        for profile in set(view.profile.tolist()):
            rows = view.profile == profile
            theta = self.model_for(profile).coefficients
            delay[rows] = theta["prefill_tokens"] * chunk[rows] + theta["prefill_pairs"] * pairs[rows]
        return np.where(features[:, 0] > 0, delay, 0.0)

    def _busy_rows_for(self, view: ClusterView) -> FloatArray:
        """``busy_until`` per row of ``view``: realigned once per snapshot, O(1) per decision."""
        if self._aligned_to is not view:
            busy = np.array([self._busy_until.get(i, -np.inf) for i in view.instance_ids])
            # Anchor to what the instances report: one idle at its heartbeat, with nothing sent
            # to it since, has no backlog (whatever the predictions said).
            sent, _ = self.in_flight.since_heartbeat(view)
            idle = (view.running == 0) & (view.waiting == 0) & (sent == 0)
            busy[idle] = np.minimum(busy[idle], view.last_heartbeat_s[idle])
            for instance_id in np.asarray(view.instance_ids)[idle].tolist():
                self._busy_until[instance_id] = float(busy[view.index_of[instance_id]])
            self._busy_rows = busy
            self._aligned_to = view
        return self._busy_rows

    def _pick_near_min(self, predicted: FloatArray, mask: BoolArray) -> int:
        """Lowest prediction; rows within ``tie_tolerance`` of it are equally good (random pick)."""
        best = float(np.min(predicted[mask]))
        near = np.flatnonzero(mask & (predicted <= best * (1 + self.tie_tolerance) + 1e-9))
        return int(near[0] if len(near) == 1 else self.rng.choice(near))

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        instance_id = view.instance_ids[row]
        now_s, features, own_s = self._chosen
        # FCFS: its prefill starts when the backlog ahead is done; the next request's after it.
        starts_s = max(now_s, float(self._busy_rows_for(view)[row]))
        self._set_busy_until(instance_id, starts_s + own_s)
        key = (request.request_id, request.attempt)
        self._sent[key] = _Sent(instance_id, str(view.profile[row]), features, starts_s, starts_s + own_s)
        # Credit: the instance will hold these blocks once it prefills them (KV events confirm).
        self.index.add(instance_id, request.block_hashes)

    def _own_prefill_s(self, profile: str, features: FloatArray) -> float:
        """Predicted seconds of the request's own prefill steps: the prediction without the
        terms for waiting (backlog, seats, KV). Only these extend the backlog, so an error in
        the calibrated backlog coefficient cannot compound from one decision to the next."""
        own = features.copy()
        own[_WAIT_TERMS] = 0.0
        return max(self.model_for(profile).predict_one(own), 0.0)

    def _set_busy_until(self, instance_id: str, value: float) -> None:
        self._busy_until[instance_id] = value
        row = None if self._aligned_to is None else self._aligned_to.index_of.get(instance_id)
        if row is not None:
            self._busy_rows[row] = value

    def _shorten_backlog(self, instance_id: str, seconds: float, now_s: float) -> None:
        busy_until = self._busy_until.get(instance_id)
        if busy_until is not None and seconds > 0:
            self._set_busy_until(instance_id, max(now_s, busy_until - seconds))

    # --- learning -----------------------------------------------------------------------------

    def on_kv_event(self, event: KvEvent) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)

    def observe(self, event: KvEvent | Completion) -> None:
        super().observe(event)
        if not isinstance(event, Completion):
            return
        sent = self._sent.pop((event.request_id, event.attempt), None)
        if sent is None:
            return
        if event.status == "ok" and event.ttft_s is not None:
            self.model_for(sent.profile).update(sent.features, event.ttft_s)
        elif event.ttft_s is None and sent.due_s > event.time_s:
            # Gone before its first token: the prefill it would still have done leaves the queue.
            self._shorten_backlog(
                sent.instance_id, sent.due_s - max(event.time_s, sent.starts_s), event.time_s
            )

    def model_for(self, profile: str) -> OnlineLinearModel:
        model = self.models.get(profile)
        if model is None:
            model = self.models[profile] = OnlineLinearModel(FEATURES, PRIOR)
        return model

    def prediction_error(self) -> dict[str, float | None]:
        """Rolling TTFT MAPE per engine profile."""
        return {profile: model.mape() for profile, model in self.models.items()}
