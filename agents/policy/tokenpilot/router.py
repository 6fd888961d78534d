"""TokenPilot: pick the instance with the lowest *predicted* time to first token.

For a request with ``input`` prompt tokens on candidate instance i:

    cached_i  = prompt tokens instance i holds (prefix index: own routing + KV events)
    P_i       = input - cached_i                  uncached tokens to prefill
    Q_i, R_i  = prefill tokens (and their attention token pairs) queued ahead on i
    steps_i   = ceil((Q_i + P_i) / prefill_budget)  engine steps until its prefill is done
    B_i, C_i  = requests and their context tokens on i (heartbeat + own sends since)
    pairs_i   = R_i + P_i·(cached_i + P_i/2)      attention token pairs of those prefills
    short_i   = KV blocks the request needs (prompt + output budget, less its cached prefix)
                beyond what i has free (heartbeat, less blocks of own sends since): it waits
                for running requests to finish and free them
    wait_i    = seconds until the engine step in progress on i ends (0 if idle): the step clock
                (``stepclock.py``), from the step boundaries the router sees

    TTFT_i ≈ θ · [steps_i, steps_i·B_i, steps_i·C_i, Q_i + P_i, pairs_i, short_i, wait_i]

Prefill is FCFS in the engine: the first token comes after the step in progress, the prefill
queued ahead and its own, each step by the step-time law (T0, c, d per step; a, b per prefill
token and token pair).

The queue ahead is the router's own bookkeeping (``queues.py``; it sends every request of the
pool), in token counts, never predicted seconds, so a prediction error cannot compound from one
decision to the next: each send adds its uncached tokens and pairs to ``Q_i, R_i``; between
decisions the queue drains at ``prefill_budget`` tokens per predicted step, stretched by the
lateness of prompts the size of the one at its head (``lateness.py``); an abort before the first
token removes what the request had left; a first token clips the queue to what was sent there
after that request; an instance idle at its heartbeat with nothing sent since has an empty queue.

θ: one ``OnlineLinearModel`` per engine profile (``predictor.py``), calibrated online on the
features recorded at decision time against the time from the send to the first token (an
admission stage's hold before the send is not the instance's doing): seconds, not counts.

The pick minimises ``TTFT_i + spare_others · delay_i + spare_decodes · harm_i`` (near-ties at
random). ``delay_i``: what the request adds to the first token of the request queued last on i
when its first chunk shares that one's last prefill step, at the calibrated per-token cost (with
``spare_others = 1`` the pick minimises the sum of the first-token times it changes). ``harm_i``:
the TPOT harm of its prefill to the B_i decodes on i (a step with a prefill chunk is slow for
every decode in it):

    own_i   = (θ_a·P_i + θ_b·P_i·(cached_i + P_i/2)) · lateness(P_i)   its own prefill seconds on i
    E_i     = own of the requests sent to i, each decayed by exp(-age / H)
    s_i     = θ_T0 + θ_c·B_i + θ_d·C_i             a decode step on i
    room_i  = H · (1 - s_i / tpot_s)               prefill seconds per H its decodes absorb
    harm_i  = B_i · [(E_i + own_i - room_i)⁺ - (E_i - room_i)⁺]

A decode on an instance prefilling a share φ of its time streams at s_i / (1 - φ) per token,
within ``tpot_s`` while φ <= 1 - s_i / tpot_s; E_i / H is φ over the last H seconds, H a typical
decode's life on the pool, at most ``tpot_horizon_s`` (``horizon.py``). Only the prefill seconds
beyond that room are charged, once per request running there.

A burst (requests decided in one call) is decided in ``batch_order.py``'s order and predicted as
a whole: a later request's first chunk joining the step that ends an earlier one's prefill is in
the earlier prediction (and its recorded features); each decision queues its work at once, so a
burst cannot pile onto one instance.

Disaggregation (a fleet with a KV link): the pick may instead send the request to a pair, its
prefill on one instance and its decode on another, when its prices say so (``pairs.py``; the
``Disaggregation`` mixin there binds its decode side and learns from its prefill leg).

Several deciders per pool: another decider's placement (``Placed``, from the decision log) is
recorded as an own send (``elsewhere.py``: the ``PlacedElsewhere`` mixin).

Per-row arithmetic runs in compiled loops (``kernels.py``, ``common/prefix_kernels.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray, IntArray, blocks_for
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.common.timing import decode_s
from agents.policy.tokenpilot import kernels
from agents.policy.tokenpilot.batch_order import cache_has_room, decision_order
from agents.policy.tokenpilot.elsewhere import PlacedElsewhere
from agents.policy.tokenpilot.features import (
    BOUNDARY_WAIT,
    FEATURES,
    PREFILL_PAIRS,
    PREFILL_TOKENS,
    PRIOR,
    STEPS,
    STEPS_X_BATCH,
)
from agents.policy.tokenpilot.horizon import DecodeHorizon
from agents.policy.tokenpilot.lateness import PrefillLateness
from agents.policy.tokenpilot.pairs import Disaggregation, KvLinkLedger
from agents.policy.tokenpilot.predictor import OnlineLinearModel
from agents.policy.tokenpilot.queues import PrefillQueues
from agents.policy.tokenpilot.sends import Chosen, Sent
from agents.policy.tokenpilot.snapshot import Fixed, Profiles, RowFeatures, Scratch, ViewRows
from agents.policy.tokenpilot.stepclock import StepClock
from agents.policy.types import (
    BLOCK_TOKENS,
    BlocksChanged,
    ClusterView,
    Finished,
    FirstToken,
    Observation,
    Placed,
    Placement,
    PrefillDone,
    RequestView,
    RowPrediction,
)

INTERACTIVE_TPOT_S = DEFAULT_SLO_CLASSES["interactive"].tpot_s or 0.1
"""The TPOT the decode-harm term protects by default: the interactive class's objective."""


class TokenPilot(Disaggregation, PlacedElsewhere, InstanceSelector):
    name = "tokenpilot"
    wants_kv_events = True

    def __init__(
        self,
        seed: int = 0,
        prefill_budget: int = 8192,
        tie_tolerance: float = 0.02,
        spare_others: float = 1.0,
        spare_decodes: float = 3.0,
        tpot_horizon_s: float = 4.0,
        tpot_s: float = INTERACTIVE_TPOT_S,
        phase_steps: float = 2.0,
        phase_lost_share: float = 0.5,
        largest_first_below_kv: float = 0.6,
    ) -> None:
        super().__init__(seed)
        self.largest_first_below_kv = largest_first_below_kv
        self.prefill_budget = prefill_budget
        self.tie_tolerance = tie_tolerance
        self.spare_others = spare_others
        self.spare_decodes = spare_decodes
        self.tpot_s = tpot_s
        self.index = PrefixIndex()
        self.models: dict[str, OnlineLinearModel] = {}
        self.queues = PrefillQueues(tpot_horizon_s)
        self.horizon = DecodeHorizon(tpot_horizon_s)  # H: learned from completions, at most this
        self.lateness = PrefillLateness()
        self.links = KvLinkLedger()  # transfers of the requests it disaggregated
        self._sent: dict[tuple[str, int], Sent] = {}
        self._chosen = Chosen(0.0, np.zeros(len(FEATURES)), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._last_queued: dict[str, tuple[str, int]] = {}  # instance id -> last request sent there
        self._batch_keys: set[tuple[str, int]] = set()  # the requests of the batch being decided
        self._revised: dict[tuple[str, int], float] = {}  # of those: seconds others' chunks add
        self._view_rows: ViewRows | None = None  # of the last snapshot decided on
        self._fixed: Fixed | None = None
        self._scratch: Scratch | None = None
        self._observed = 0  # ends observed so far (each may change what ``Fixed`` holds)
        self._budget = float(prefill_budget)
        self.clock = StepClock(phase_steps, phase_lost_share)
        self._last_view: ClusterView | None = None  # the last snapshot decided on (for ``Placed``)
        warm_up()

    # --- deciding -----------------------------------------------------------------------------

    def order(
        self, requests: Sequence[RequestView], candidates: Sequence[BoolArray], view: ClusterView
    ) -> list[int]:
        """The order a burst of arrivals is decided in (``batch_order.decision_order``)."""
        return decision_order(requests, candidates, view, self.index, self.largest_first_below_kv)

    def reorders(self, view: ClusterView) -> bool:
        """Whether a burst on ``view`` would be decided in this router's order."""
        return cache_has_room(view, self.largest_first_below_kv)

    def start_batch(self, requests: Sequence[RequestView]) -> None:
        self._revised, self._batch_keys = {}, {r.key for r in requests}

    def finish_batch(self, requests: Sequence[RequestView], placements: list[Placement]) -> list[Placement]:
        """Raise the prediction of a request of this batch whose first prefill step a later
        request of the batch joins (chunked prefill runs them together, so its first token also
        waits for the joining chunk): a burst is known as a whole."""
        revised, self._revised, self._batch_keys = self._revised, {}, set()
        if not revised:
            return placements
        return [
            replace(p, predicted_ttft_s=p.predicted_ttft_s + revised[r.key])
            if p.predicted_ttft_s is not None and r.key in revised
            else p
            for r, p in zip(requests, placements, strict=True)
        ]

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self.index.size_like(view)
        fixed = self._fixed_for(view)
        scratch = self._scratch_for(len(view))
        rows = self._features(request, view, now_s, fixed, scratch)
        features, own_tokens, own_pairs = rows.features, rows.new, rows.pairs
        predicted = self._predict(features, view)
        # score = predicted + spare_others · delay + spare_decodes · harm (module docstring)
        scores, near = scratch.scores, scratch.near
        count = kernels.score_rows(
            self._budget,
            float(self.spare_others),
            float(self.spare_decodes),
            fixed.horizon_s,
            float(self.tpot_s),
            1 + self.tie_tolerance,
            features,
            predicted,
            rows.rows,
            self.queues.recent,
            mask,
            fixed.rows.profiles.of_row,
            fixed.thetas,
            fixed.lateness,
            scores,
            near,
        )
        row = self._pick_near(near[:count], view)
        pair = self._pair(request, view, mask, fixed, rows, predicted, scores, row, now_s)  # ``pairs.py``
        at = row if pair is None else pair.prefill  # the row its prefill runs on
        # (Python floats from here on: the same IEEE doubles, cheaper to compute with)
        joined, tokens, predicted_s = (
            float(scores[0, at]),
            float(own_tokens[at]),
            float(predicted[at]),
        )
        cached = request.input_tokens - tokens
        self._chosen = Chosen(
            now_s,
            features[at].copy(),  # (a scratch array: the next decision overwrites it)
            predicted_s,
            tokens,
            float(own_pairs[at]),
            joined,
            joined * (cached + joined / 2),
            float(scores[1, at]),
            pair,
        )
        if pair is not None:
            return self._disaggregated(pair, float(predicted[row]))
        reason = f"min predicted TTFT ({cached:.0f} of {request.input_tokens} prompt tokens cached)"
        return Placement(row, reason, predicted_s)

    def predict_rows(self, request: RequestView, view: ClusterView, now_s: float) -> RowPrediction:
        """The predicted TTFT of ``request`` on every row of ``view`` were it sent now, and of it
        its own prefill: what it takes on an idle instance (the rest waits for the prefill
        queued ahead, the decode batch its steps share, the KV it lacks). What SLOMax admits by
        and FleetMind compares DCs by; nothing is recorded (the queues only drain to ``now_s``)."""
        predicted, own_tokens, own_pairs = self._predicted(request, view, now_s)
        alone = np.zeros((len(view), len(FEATURES)))
        alone[:, STEPS] = np.ceil(own_tokens / self._budget)
        alone[:, PREFILL_TOKENS] = own_tokens
        alone[:, PREFILL_PAIRS] = own_pairs
        return RowPrediction(predicted, self._predict(alone, view))

    def _predicted(
        self, request: RequestView, view: ClusterView, now_s: float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Predicted TTFT per row, and per row the request's own uncached tokens and pairs."""
        self.index.size_like(view)
        rows = self._features(request, view, now_s)
        return self._predict(rows.features, view), rows.new, rows.pairs

    def _predict(self, features: FloatArray, view: ClusterView) -> FloatArray:
        """``features @ θ`` per row, θ of the row's engine profile (numpy's product: see
        ``kernels``)."""
        groups = self._rows_of(view).profiles.groups
        if len(groups) == 1:  # a uniform pool (the usual case): no gather or scatter
            # (``ndarray.dot``: the same BLAS product as ``@`` for a matrix and a vector, called
            # with less overhead)
            uniform: FloatArray = features.dot(self.model_for(groups[0][0]).theta)
            return uniform
        predicted = np.empty(len(view))
        for profile, rows in groups:
            predicted[rows] = features[rows].dot(self.model_for(profile).theta)
        return predicted

    def features(self, request: RequestView, view: ClusterView, now_s: float) -> FloatArray:
        """The model's features of ``request`` on every row of ``view`` (n x len(FEATURES))."""
        return self._features(request, view, now_s).features

    def _features(
        self,
        request: RequestView,
        view: ClusterView,
        now_s: float,
        fixed: Fixed | None = None,
        scratch: Scratch | None = None,
    ) -> RowFeatures:
        """Features, and per row the request's own uncached tokens and their attention pairs, and
        the decode batch and its context (formulas: ``kernels.row_features``; the queues are
        drained to ``now_s`` first). In ``scratch``'s arrays if given (they are overwritten by the
        next decision), else in new ones."""
        self._last_view = view
        fixed = fixed or self._fixed_for(view)
        at, thetas = fixed.rows, fixed.thetas
        matched = self.index.match_array(request.block_hashes, view)
        sent, sent_tokens = self.in_flight.since_heartbeat(view)
        queued, queued_pairs = self._queued(view, now_s, sent, sent_tokens, at, thetas)
        clock = self.clock
        clock_slots, boundary_s, sent_s, awaiting, touched, step_by_slot = fixed.clock
        open_requests = self.in_flight.per_instance(self.in_flight.requests, view)
        if scratch is None:
            features, rows = np.empty((len(view), len(FEATURES))), np.empty((5, len(view)))
        else:
            features, rows = scratch.features, scratch.rows
        kernels.row_features(
            float(request.input_tokens),
            # KV blocks short: what the request needs beyond what is free, less the reservations
            # of own sends the heartbeat does not show yet (their budgets taken as ours).
            float(blocks_for(request.input_tokens + request.output_budget)),
            float(request.output_budget),
            self._budget,
            float(now_s),
            # the boundary wait: ``stepclock.py``; busy where own requests are open (exact where
            # it sends all of an instance's traffic: a stale heartbeat would call an instance busy
            # that has drained since), or, on one never sent to, where the heartbeat says so
            float(clock.phase_steps),
            float(clock.lost_share),
            matched,
            at.counts,
            sent,
            sent_tokens,
            queued,
            queued_pairs,
            open_requests,
            at.profiles.of_row,
            thetas,
            fixed.scales,
            clock_slots,
            boundary_s,
            sent_s,
            awaiting,
            touched,
            step_by_slot,
            features,
            rows,
        )
        if type(clock).wait is not StepClock.wait:  # a clock of its own (``bench.phase``'s oracle)
            scale = fixed.scales[at.profiles.of_row]
            features[:, BOUNDARY_WAIT] = clock.wait(view, now_s, open_requests, rows[2], rows[4], scale)
        return RowFeatures(features, rows, thetas)

    def _scratch_for(self, n: int) -> Scratch:
        """The arrays a decision on ``n`` rows computes into (one set, reused: nothing of a
        decision's arrays is kept beyond it, ``Chosen`` copies what it keeps)."""
        if self._scratch is None or len(self._scratch.near) != n:
            self._scratch = Scratch(
                np.empty((n, len(FEATURES))), np.empty((5, n)), np.empty((3, n)), np.empty(n, dtype=np.int64)
            )
        return self._scratch

    def _fixed_for(self, view: ClusterView) -> Fixed:
        """``Fixed`` for ``view`` as things stand (kept until the snapshot changes or something
        is observed)."""
        fixed = self._fixed
        if fixed is not None and fixed.version == view.version and fixed.observed == self._observed:
            return fixed
        at = self._rows_of(view)
        names = at.profiles.names
        self._fixed = Fixed(
            view.version,
            self._observed,
            at,
            self._thetas(names),
            np.array([self.clock.scale(profile) for profile in names], dtype=np.float64),
            self.clock.columns(view),
            self.lateness.ratio,
            float(self.queues.horizon_s),
        )
        return self._fixed

    def _queued(
        self,
        view: ClusterView,
        now_s: float,
        sent: IntArray,
        sent_tokens: IntArray,
        at: ViewRows,
        thetas: FloatArray,
    ) -> tuple[FloatArray, FloatArray]:
        """Prefill tokens and pairs queued ahead per row, drained to ``now_s`` at the predicted
        rate: one full step, ``T0 + c·B + d·C + a·budget + b·budget·(R/Q)``, per ``budget``,
        stretched by the lateness of the prompt at the queue's head (FCFS: the queue drains at
        its pace; ``kernels.queue_pace``)."""
        queues = self.queues
        if not queues.aligned_to(view):
            queues.align(view, (view.running == 0) & (view.waiting == 0) & (sent == 0))
        if queues.drained_to(now_s):
            return queues.tokens, queues.pairs
        step_s = np.empty(len(view))
        kernels.queue_pace(
            self._budget,
            queues.tokens,
            queues.pairs,
            queues.head_tokens,
            at.counts,
            sent,
            sent_tokens,
            at.profiles.of_row,
            thetas,
            self.lateness.ratio,
            step_s,
        )
        queues.drain(now_s, step_s, self.prefill_budget)
        return queues.tokens, queues.pairs

    def _rows_of(self, view: ClusterView) -> ViewRows:
        """What the kernels read of ``view`` (``ViewRows``), once per snapshot; the profiles
        are read again only when the profile column changes (the streaming worker's snapshots
        share it until the pool's membership changes)."""
        cached = self._view_rows
        if cached is not None and cached.version == view.version:
            return cached
        if cached is not None and cached.profiles.column is view.profile:
            profiles = cached.profiles
        else:
            profiles = Profiles.of(view.profile)
        counts = np.array([view.running, view.tokens_in_flight, view.kv_total - view.kv_used], dtype=np.int64)
        self._view_rows = ViewRows(view.version, profiles, counts.reshape(3, len(view)))
        return self._view_rows

    def _thetas(self, profiles: tuple[str, ...]) -> FloatArray:
        """θ of each profile, one row each (what the kernels index by ``profile_of_row``)."""
        if len(profiles) == 1:
            return self.model_for(profiles[0]).theta.reshape(1, len(FEATURES))
        thetas = np.empty((len(profiles), len(FEATURES)))
        for k, profile in enumerate(profiles):
            thetas[k] = self.model_for(profile).theta
        return thetas

    def _pick_near(self, near: IntArray, view: ClusterView) -> int:
        """One of the rows within ``tie_tolerance`` of the lowest score (they are equally good):
        at random, in this decider's lane where it has some (``InstanceSelector.lane``)."""
        if len(near) == 1:
            return int(near[0])
        if self.lane[1] > 1:
            mine = near[self.in_lane([view.instance_ids[row] for row in near])]
            near = mine if len(mine) else near
        return int(near[self.rng.integers(len(near))])

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        """Record the send: its prefill's work on the row it prefills on (``row``, or a pair's
        prefill row, whose KV transfer is booked on its DC's link)."""
        chosen = self._chosen
        if chosen.pair is not None:
            row = self._book_pair(chosen.pair, request, view, row)
        instance_id = view.instance_ids[row]
        profile = self._rows_of(view).profiles.by_row[row]
        key = (request.request_id, request.attempt)
        self.clock.sent(instance_id, profile, key, chosen.now_s)
        due_s = chosen.now_s + chosen.predicted_s * self.lateness.of(chosen.tokens)
        mark = self.queues.add(row, chosen.tokens, chosen.pairs, chosen.prefill_s, key, due_s, chosen.now_s)
        # Busy (a decode batch, or prefill queued ahead of it): it starts at the next step boundary.
        busy = chosen.features[STEPS_X_BATCH] > 0 or chosen.features[PREFILL_TOKENS] > chosen.tokens
        self._sent[key] = Sent(
            instance_id,
            profile,
            chosen.features,
            chosen.tokens,
            chosen.pairs,
            chosen.predicted_s,
            due_s,
            bool(busy),
            mark,
            max(chosen.now_s - request.arrival_s, 0.0),
        )
        if chosen.joined_tokens > 0:
            self._joined(self._last_queued.get(instance_id), chosen)
        self._last_queued[instance_id] = key
        # Credit: the instance will hold these blocks once it prefills them (KV events confirm).
        self.index.add(instance_id, request.block_hashes)

    def _joined(self, key: tuple[str, int] | None, chosen: Chosen) -> None:
        """``chosen``'s first chunk runs in the step that ends the prefill of ``key``, the
        request queued last on that instance. If that request is in the batch being decided
        and waits for a step boundary (an idle instance starts it at once, alone), its first
        token waits for the joining chunk too: its prediction and its recorded features grow by
        that work. Later joiners are not added: the model is calibrated on what was known when
        each prediction went out."""
        if key is None or key not in self._batch_keys:
            return
        sent = self._sent.get(key)
        if sent is None or not sent.waits_for_step:
            return
        theta = self.model_for(sent.profile).theta
        extra = chosen.joined_tokens * theta[PREFILL_TOKENS] + chosen.joined_pairs * theta[PREFILL_PAIRS]
        sent.features[PREFILL_TOKENS] += chosen.joined_tokens
        sent.features[PREFILL_PAIRS] += chosen.joined_pairs
        sent.due_s += extra
        self._revised[key] = self._revised.get(key, 0.0) + extra

    # --- learning -----------------------------------------------------------------------------

    def on_kv_event(self, event: BlocksChanged) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)

    def observe(self, event: Observation) -> None:
        self._observe(event)
        if isinstance(event, Finished):  # θ, the clock's scale, the horizon, the lateness learn
            self._observed += 1  # only from ends: what ``Fixed`` holds may have changed

    def _observe(self, event: Observation) -> None:
        if isinstance(event, Placed):
            self._placed_elsewhere(event)  # (then in flight, as an own send is after ``pick``)
        super().observe(event)
        if isinstance(event, PrefillDone):
            self._prefill_done(event)
            return
        if not isinstance(event, FirstToken | Finished):
            return
        key = (event.request_id, event.attempt)
        if isinstance(event, FirstToken):  # (a first token and an end both end an engine step)
            self.clock.first_token(key, event.instance_id, event.time_s)
            sent_first = self._sent.get(key)
            if sent_first is not None:
                self.queues.first_token(sent_first.instance_id, sent_first.mark, key)
            return
        self.clock.finished(key, event.instance_id, event.time_s, event.status == "ok")
        sent = self._sent.pop(key, None)
        if sent is None:
            return
        if event.ttft_s is not None:  # it had its first token (the event may have been missed)
            self.queues.first_token(sent.instance_id, sent.mark, key)
        if sent.own and event.status == "ok" and event.ttft_s is not None:
            self._calibrate(sent, event.ttft_s)
            if event.tpot_s is not None and event.output_tokens > 1:
                self.horizon.add(decode_s(event.tpot_s, event.output_tokens))
                self.queues.horizon_s = self.horizon.value_s
        elif event.ttft_s is None and event.time_s < sent.due_s:
            # Gone before its first token: what it had left to prefill leaves the queue.
            self.queues.remove(sent.instance_id, sent.tokens, sent.pairs)
        if event.ttft_s is None:
            self.queues.forget(sent.instance_id, key)

    def _calibrate(self, sent: Sent, ttft_s: float) -> None:
        """θ and the lateness learn from an own send's first token, ``ttft_s`` after its arrival
        (less its hold before the send: what the features at the send predicted)."""
        after_send = ttft_s - sent.waited_s
        self.model_for(sent.profile).update(sent.features, after_send)
        if sent.tokens >= 0.5 * sent.features[PREFILL_TOKENS]:  # mostly its own prefill
            self.lateness.add(sent.tokens, sent.predicted_s, after_send)

    def model_for(self, profile: str) -> OnlineLinearModel:
        model = self.models.get(profile)
        if model is None:
            model = self.models[profile] = OnlineLinearModel(FEATURES, PRIOR)
        return model

    def prediction_error(self) -> dict[str, float | None]:
        """Rolling TTFT MAPE per engine profile."""
        return {profile: model.mape() for profile, model in self.models.items()}


_warmed_up = False


def warm_up() -> None:
    """Have numba compile, or load from its cache, the kernels a decision runs, with the
    argument types a decision passes them, by deciding once on a throwaway pool of two
    instances: the first TokenPilot of a process does, so that its first real decision (a
    worker's first request) does not pay for it (docs/results/speed.md)."""
    global _warmed_up
    if _warmed_up:
        return
    _warmed_up = True
    pilot = TokenPilot()
    counts, names = np.zeros(2, dtype=np.int64), np.array(["-", "-"])
    view = ClusterView(
        0, ("a", "b"), names, names, names, names, np.ones(2, dtype=bool),
        counts, counts, counts, counts, np.full(2, 64, dtype=np.int64), np.zeros(2),
    )  # fmt: skip
    request = RequestView("warm-up", 1, "-", "-", "-", 2 * BLOCK_TOKENS, 16, (1, 2), 0.0)
    row = pilot.place([request], [np.ones(2, dtype=bool)], view, 0.0)[0].instance
    pilot.predict_rows(request, view, 1.0)
    instance_id = view.instance_ids[row]
    pilot.observe(BlocksChanged(instance_id, "removed", (2,), 1.0))
    pilot.observe(Finished("warm-up", 1, instance_id, "ok", 1024, 0, 16, 0.5, 0.01, 1.5))
