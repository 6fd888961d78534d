"""TokenPilot: pick the instance with the lowest *predicted* time to first token.

For a request with ``input`` prompt tokens on candidate instance i:

    cached_i  = prompt tokens instance i holds (prefix index: own routing + KV events)
    P_i       = input - cached_i                  uncached tokens to prefill
    Q_i       = uncached prompt tokens queued ahead on i: requests this router sent there whose
                first token is not due yet (prefill is FCFS inside the engine)
    steps_i   = ceil((Q_i + P_i) / prefill_budget)  engine steps until this prefill is done
    B_i, C_i  = decoding requests and their context tokens on i (heartbeat + own sends since)
    pairs_i   = token pairs of attention in those prefills: P_i·(cached_i + P_i/2) + queued pairs
    waiting_i = requests waiting on i (heartbeat + own sends since): seats or KV blocking
    short_i   = KV blocks the request needs (prompt + output budget, less its cached prefix)
                beyond what i has free (heartbeat, less blocks of own sends since): it waits
                for running requests to finish and free them

    TTFT_i ≈ θ · [steps_i, steps_i·B_i, steps_i·C_i, Q_i + P_i, pairs_i, waiting_i, short_i]

which is the engine's step-time law (T0, c, d per step; a, b per prefill token and token pair)
applied to the prefill work ahead of and including the request. θ is not hand-tuned: one
``OnlineLinearModel`` per engine profile is calibrated online from completions (the features
recorded at decision time against the TTFT the completion reports), so a heterogeneous pool
is compared in seconds, not counts.

A cache-warm but busy instance wins only when the prefill it saves outweighs the queue ahead;
a burst cannot pile onto one instance because each decision immediately adds its work to that
instance's queue and in-flight counts, and near-ties are broken at random.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from agents.policy.base import BoolArray, FloatArray, Pick, RoutingPolicy, blocks_for
from agents.policy.predictor import OnlineLinearModel
from agents.policy.prefix_index import PrefixIndex
from agents.policy.types import BLOCK_TOKENS, ClusterView, Completion, KvEvent, RequestView

FEATURES = (
    "steps",
    "steps_x_batch",
    "steps_x_context",
    "prefill_tokens",
    "prefill_pairs",
    "waiting",
    "kv_shortfall_blocks",
)
PRIOR = (0.01, 4e-5, 8e-8, 3e-5, 1.5e-9, 0.05, 0.01)
"""A generic H100 7-8B engine, as a soft starting point; calibration replaces it within minutes."""


@dataclass(slots=True)
class _Sent:
    instance_id: str
    profile: str
    features: np.ndarray
    predicted_s: float


@dataclass(slots=True)
class _Chosen:
    """What ``pick`` decided, for ``on_routed`` to record (computed once, used twice)."""

    now_s: float
    features: np.ndarray
    predicted_s: float
    new_tokens: float
    pairs: float


class TokenPilot(RoutingPolicy):
    name = "tokenpilot"
    wants_kv_events = True

    def __init__(self, seed: int = 0, prefill_budget: int = 8192, tie_tolerance: float = 0.02) -> None:
        super().__init__(seed)
        self.prefill_budget = prefill_budget
        self.tie_tolerance = tie_tolerance
        self.index = PrefixIndex()
        self.models: dict[str, OnlineLinearModel] = {}
        self._due: list[tuple[float, str, float, float]] = []  # (first token due, instance, tokens, pairs)
        self._queued_totals: dict[str, list[float]] = {}
        self._sent: dict[tuple[str, int], _Sent] = {}
        self._chosen = _Chosen(0.0, np.zeros(len(FEATURES)), 0.0, 0.0, 0.0)

    # --- deciding -----------------------------------------------------------------------------

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        self.index.size_like(view)
        features, own_new, own_pairs = self._features(request, view, now_s)
        predicted = np.full(len(view), np.inf)
        for profile in set(view.profile[mask].tolist()):
            rows = mask & (view.profile == profile)
            predicted[rows] = self.model_for(profile).predict(features[rows])
        row = self._pick_near_min(predicted, mask)
        self._chosen = _Chosen(now_s, features[row], float(predicted[row]), own_new[row], own_pairs[row])
        return Pick(row, "min predicted TTFT", float(predicted[row]))

    def features(self, request: RequestView, view: ClusterView, now_s: float) -> FloatArray:
        """The model's features of ``request`` on every row of ``view`` (n x len(FEATURES))."""
        return self._features(request, view, now_s)[0]

    def _features(
        self, request: RequestView, view: ClusterView, now_s: float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Features, and per row the request's own uncached tokens and their attention pairs."""
        matched = self.index.match_array(request.block_hashes, view.index_of, len(view))
        cached = np.minimum(matched * BLOCK_TOKENS, request.input_tokens - 1).astype(np.float64)
        new = request.input_tokens - cached
        queued, queued_pairs = self._queued(view, now_s)
        total = queued + new
        steps = np.ceil(total / self.prefill_budget)
        sent, sent_tokens = self.in_flight.since_heartbeat(view)
        batch = (view.running + sent).astype(np.float64)
        context = (view.tokens_in_flight + sent_tokens).astype(np.float64)
        waiting = (view.waiting + sent).astype(np.float64)
        own_pairs = new * (cached + new / 2)
        pairs = own_pairs + queued_pairs
        need = blocks_for(request.input_tokens + request.output_budget) - matched
        # Reservations of own sends the heartbeat does not show yet (their budgets taken as ours).
        unseen = (sent_tokens + sent * request.output_budget) / BLOCK_TOKENS
        free = view.kv_total - view.kv_used - unseen
        shortfall = np.maximum(need - free, 0).astype(np.float64)
        features = np.column_stack([steps, steps * batch, steps * context, total, pairs, waiting, shortfall])
        return features, new, own_pairs

    def _queued(self, view: ClusterView, now_s: float) -> tuple[FloatArray, FloatArray]:
        """Uncached prompt tokens (and their attention pairs) of own requests per row whose first
        token is not due yet. Totals are kept per instance; due entries leave a heap, so the
        cost per call is O(instances + entries that came due)."""
        due = self._due
        while due and due[0][0] <= now_s:
            _, instance_id, tokens, pairs = heapq.heappop(due)
            total = self._queued_totals[instance_id]
            total[0] -= tokens
            total[1] -= pairs
        queued = np.zeros((len(view), 2))
        for instance_id, total in self._queued_totals.items():
            row = view.index_of.get(instance_id)
            if row is not None:
                queued[row] = total
        return np.maximum(queued[:, 0], 0.0), np.maximum(queued[:, 1], 0.0)

    def _pick_near_min(self, predicted: FloatArray, mask: BoolArray) -> int:
        """Lowest prediction; rows within ``tie_tolerance`` of it are equally good (random pick)."""
        best = float(np.min(predicted[mask]))
        near = np.flatnonzero(mask & (predicted <= best * (1 + self.tie_tolerance) + 1e-9))
        return int(near[0] if len(near) == 1 else self.rng.choice(near))

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        instance_id = view.instance_ids[row]
        chosen = self._chosen
        # Its prefill is queued on the instance until its first token is predicted.
        new, pairs = float(chosen.new_tokens), float(chosen.pairs)
        heapq.heappush(self._due, (chosen.now_s + chosen.predicted_s, instance_id, new, pairs))
        total = self._queued_totals.setdefault(instance_id, [0.0, 0.0])
        total[0] += new
        total[1] += pairs
        key = (request.request_id, request.attempt)
        self._sent[key] = _Sent(instance_id, str(view.profile[row]), chosen.features, chosen.predicted_s)
        # Credit: the instance will hold these blocks once it prefills them (KV events confirm).
        self.index.add(instance_id, request.block_hashes)

    # --- learning -----------------------------------------------------------------------------

    def on_kv_event(self, event: KvEvent) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)

    def observe(self, event: KvEvent | Completion) -> None:
        super().observe(event)
        if isinstance(event, Completion):
            sent = self._sent.pop((event.request_id, event.attempt), None)
            if sent is not None and event.status == "ok" and event.ttft_s is not None:
                self.model_for(sent.profile).update(sent.features, event.ttft_s)

    def model_for(self, profile: str) -> OnlineLinearModel:
        model = self.models.get(profile)
        if model is None:
            model = self.models[profile] = OnlineLinearModel(FEATURES, PRIOR)
        return model

    def prediction_error(self) -> dict[str, float | None]:
        """Rolling TTFT MAPE per engine profile."""
        return {profile: model.mape() for profile, model in self.models.items()}
