"""TokenPilot's disaggregation: serve a request whole, or prefill it on one instance and decode
it on another, whichever its latency model prices lower.

TokenPilot scores every row i for the request served whole (``router.py``):
``score_i = TTFT_i + spare_others · delay_i + spare_decodes · harm_i``. Its aggregated pick is the
best candidate row a, at ``score_a``. A pair (p, d) of one DC, p a row that may prefill (role
``prefill`` or ``both``) and d one that may decode (a candidate), p != d, costs

    prefill_p  = score_p, of which harm_p only where p decodes too (role ``both``)
    transfer_d = link_wait + 8 · kv_bytes_per_token · P_d / (gbps · 1e9)
    decode_d   = TTFT of a one-token prefill on d: θ_d · [steps', steps'·B_d, steps'·C_d,
                 Q_d + 1, R_d + input, short_d, wait_d],  steps' = ceil((Q_d + 1) / budget)
    pair(p, d) = prefill_p + transfer_d + decode_d

where P_d is the prompt's part d does not hold (what the decode side loads: vLLM's connectors
move only the tokens beyond the decode instance's own prefix hit); Q_d, R_d are the prefill
tokens and pairs queued ahead on d and short_d, wait_d its KV shortfall and boundary wait, as in
the request's own features on d: the decode instance receives the prompt computed but for its
last token, which it computes behind what is queued there. The link's wait is this router's own
ledger of the transfers it ordered (``KvLinkLedger``: first come first served, as the link
serves them).

The cheapest pair is the one of least ``pair(p, d)``. The request is disaggregated when that
pair is predicted to meet the request's TTFT objective and serving it whole is not
(``pairs_better``): a pair is taken for the goodput it adds, a request it turns from a miss into
a hit; never to trade the request's own first token for the decodes' TPOT, nor to shave a first
token that meets its objective either way (what rules taking more pairs did to the capacity,
on traffic tuned on and not, is in ``docs/results/disagg.md``). So a busy prefill pool, a slow
or queued link, or a decode instance that can absorb the prefill all keep it whole (local
prefill), and so does a class without a TTFT objective; there is no length threshold.

The decode side is bound again when the KV cache is ready to move (``TokenPilot.bind_decode``:
the decode instance with the soonest ``decode_d`` then), since the queues seen at the decision
have moved on by then.

``Disaggregation``, a mixin of ``TokenPilot`` (``router.py``), puts these prices to work on the
router's state:

- deciding (``_pair``, in ``pick``): on a fleet with a KV link, the cheapest pair, taken when
  ``pairs_better`` says so; its ``Placement`` names the decode row as its instance and the
  prefill row as ``prefill_instance``;
- recording (``_book_pair``, in ``on_routed``): its transfer booked on its DC's ``KvLinkLedger``,
  the prompt credited to the decode side too; the rest of the send is recorded on the prefill
  row, as a request served whole is on its row;
- binding (``bind_decode``, above);
- learning (``_prefill_done``): the end of the prefill leg is the request's first token and end
  on its prefill row, what θ and the lateness learn from; its later first token and end, on the
  decode row, calibrate nothing (they include the transfer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray
from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.tokenpilot.features import (
    PREFILL_PAIRS,
    PREFILL_TOKENS,
    STEPS,
    STEPS_X_BATCH,
    STEPS_X_CONTEXT,
)
from agents.policy.types import ROLE_PREFILL, ClusterView, Placement, PrefillDone, RequestView

if TYPE_CHECKING:
    from agents.policy.common.inflight import InFlight
    from agents.policy.common.prefix_index import PrefixIndex
    from agents.policy.tokenpilot.queues import PrefillQueues
    from agents.policy.tokenpilot.sends import Sent
    from agents.policy.tokenpilot.snapshot import Fixed, RowFeatures
    from agents.policy.tokenpilot.stepclock import StepClock

BITS_PER_BYTE = 8


@dataclass(frozen=True, slots=True)
class Pair:
    """The cheapest pair: prefill on row ``prefill``, decode on row ``decode``; ``ttft_s`` the
    predicted time to first token through it, ``cost_s`` its price (module docstring), and
    ``transfer_ready_s`` / ``transfer_s`` when its KV is predicted to be ready to move and how
    long the move takes on the link alone."""

    prefill: int
    decode: int
    ttft_s: float
    cost_s: float
    transfer_ready_s: float
    transfer_s: float


class KvLinkLedger:
    """The transfers this router ordered, per DC link: when each link is free again."""

    def __init__(self) -> None:
        self._free_s: dict[str, float] = {}

    def wait_s(self, dc: str, ready_s: float) -> float:
        """How long a transfer ready at ``ready_s`` waits for those ordered before it."""
        return max(self._free_s.get(dc, ready_s) - ready_s, 0.0)

    def book(self, dc: str, ready_s: float, transfer_s: float) -> None:
        """Order a transfer of ``transfer_s`` on ``dc``'s link, ready at ``ready_s``."""
        self._free_s[dc] = ready_s + self.wait_s(dc, ready_s) + transfer_s


def pairs_better(pair: Pair, whole_ttft_s: float, request: RequestView) -> bool:
    """Whether ``request`` goes to ``pair`` rather than whole, predicted ``whole_ttft_s`` there:
    the pair meets its class's TTFT objective (the default classes') and whole does not."""
    slo = DEFAULT_SLO_CLASSES.get(request.slo_class)
    if slo is None or slo.ttft_s is None:
        return False
    return pair.ttft_s <= slo.ttft_s < whole_ttft_s


def best_pair(
    request: RequestView,
    view: ClusterView,
    candidates: BoolArray,
    predicted: FloatArray,
    features: FloatArray,
    rows: FloatArray,
    scores: FloatArray,
    theta_of_row: FloatArray,
    budget: float,
    spare_others: float,
    links: KvLinkLedger,
    now_s: float,
) -> Pair | None:
    """The cheapest pair for ``request`` (module docstring), None if the view has none: no row
    that may prefill beside the decode ``candidates`` in a DC with a KV link. ``predicted``,
    ``features``, ``rows`` (P, pairs, B, C, s) and ``scores`` (chunk, own, score) are the
    aggregated decision's, per row; ``theta_of_row`` each row's θ (n x features)."""
    prefill_rows = view.prefill_rows(request)
    if not prefill_rows.any():
        return None
    prefill_only = view.role == ROLE_PREFILL
    prefill_cost = np.where(
        prefill_only,
        predicted + spare_others * scores[0] * theta_of_row[:, PREFILL_TOKENS],
        scores[2],
    )
    decode_cost = decode_leg_s(request, features, rows, theta_of_row, budget)
    best: Pair | None = None
    for dc in np.unique(view.dc[prefill_rows]):
        gbps = view.dcs.link_gbps(str(dc))
        here = view.dc == dc
        prefill_at = np.flatnonzero(prefill_rows & here)
        decode_at = np.flatnonzero(candidates & here)
        if gbps <= 0 or not len(decode_at):
            continue
        transfer = transfer_s(view.kv_bytes_per_token[decode_at].astype(np.float64), rows[0][decode_at], gbps)
        ready = now_s + predicted[prefill_at]
        waits = np.array([links.wait_s(str(dc), r) for r in ready])
        side = prefill_cost[prefill_at] + waits
        decode_side = decode_cost[decode_at] + transfer
        for p_at, d_at in _two_best(prefill_at, side, decode_at, decode_side):
            p, d = int(prefill_at[p_at]), int(decode_at[d_at])
            cost = float(side[p_at] + decode_side[d_at])
            if best is None or cost < best.cost_s:
                ttft = float(predicted[p] + waits[p_at] + decode_side[d_at])
                best = Pair(p, d, ttft, cost, float(ready[p_at]), float(transfer[d_at]))
    return best


def transfer_s(kv_bytes_per_token: FloatArray, tokens: FloatArray, gbps: float) -> FloatArray:
    """Seconds a link of ``gbps`` takes to move ``tokens`` of KV cache (per row)."""
    seconds: FloatArray = BITS_PER_BYTE * kv_bytes_per_token * tokens / (gbps * 1e9)
    return seconds


def decode_leg_s(
    request: RequestView, features: FloatArray, rows: FloatArray, theta_of_row: FloatArray, budget: float
) -> FloatArray:
    """``decode_d`` on every row (module docstring), from the request's own features there."""
    leg = features.copy()
    queued = features[:, PREFILL_TOKENS] - rows[0]
    steps = np.ceil((queued + 1) / budget)
    leg[:, STEPS] = steps
    leg[:, STEPS_X_BATCH] = steps * rows[2]
    leg[:, STEPS_X_CONTEXT] = steps * rows[3]
    leg[:, PREFILL_TOKENS] = queued + 1
    leg[:, PREFILL_PAIRS] = features[:, PREFILL_PAIRS] - rows[1] + request.input_tokens
    decode: FloatArray = np.einsum("ij,ij->i", leg, theta_of_row)
    return decode


def _two_best(
    prefill_at: np.ndarray, prefill_cost: FloatArray, decode_at: np.ndarray, decode_cost: FloatArray
) -> list[tuple[int, int]]:
    """Positions (in ``prefill_at``, ``decode_at``) of the cheapest pairs of two different rows:
    the cheapest prefill with the cheapest other decode, and the cheapest decode with the
    cheapest other prefill (one of them is the cheapest pair)."""
    pairs = []
    p = int(np.argmin(prefill_cost))
    d_cost = np.where(decode_at == prefill_at[p], np.inf, decode_cost)
    if np.isfinite(d_cost).any():
        pairs.append((p, int(np.argmin(d_cost))))
    d = int(np.argmin(decode_cost))
    p_cost = np.where(prefill_at == decode_at[d], np.inf, prefill_cost)
    if np.isfinite(p_cost).any():
        pairs.append((int(np.argmin(p_cost)), d))
    return pairs


class Disaggregation:
    """The disaggregation part of ``TokenPilot`` (module docstring). It holds no state of its
    own: it reads and records the router's, declared below for the type checker."""

    if TYPE_CHECKING:  # ``TokenPilot``'s (and ``InstanceSelector``'s ``in_flight``)
        links: KvLinkLedger
        index: PrefixIndex
        in_flight: InFlight
        clock: StepClock
        queues: PrefillQueues
        spare_others: float
        _budget: float
        _observed: int
        _sent: dict[tuple[str, int], Sent]

        def _fixed_for(self, view: ClusterView) -> Fixed: ...
        def _features(self, request: RequestView, view: ClusterView, now_s: float) -> RowFeatures: ...
        def _calibrate(self, sent: Sent, ttft_s: float) -> None: ...

    def _pair(
        self,
        request: RequestView,
        view: ClusterView,
        mask: BoolArray,
        fixed: Fixed,
        rows: RowFeatures,
        predicted: FloatArray,
        scores: FloatArray,
        whole: int,
        now_s: float,
    ) -> Pair | None:
        """The pair ``request`` goes to, None to serve it whole on row ``whole`` (the aggregated
        pick): the cheapest pair, if ``pairs_better`` than whole. ``fixed``, ``rows``,
        ``predicted`` and ``scores`` are the aggregated decision's (``best_pair``)."""
        if not view.dcs.kv_link_gbps:  # a fleet that cannot disaggregate
            return None
        theta_of_row = fixed.thetas[fixed.rows.profiles.of_row]
        pair = best_pair(
            request, view, mask, predicted, rows.features, rows.rows, scores, theta_of_row,
            self._budget, float(self.spare_others), self.links, now_s,
        )  # fmt: skip
        if pair is None or not pairs_better(pair, float(predicted[whole]), request):
            return None
        return pair

    @staticmethod
    def _disaggregated(pair: Pair, whole_s: float) -> Placement:
        """The placement of a request sent to ``pair``, predicted ``whole_s`` served whole."""
        reason = f"disaggregated: predicted TTFT {pair.ttft_s:.3f} s, whole {whole_s:.3f} s"
        return Placement(pair.decode, reason, pair.ttft_s, prefill_instance=pair.prefill)

    def _book_pair(self, pair: Pair, request: RequestView, view: ClusterView, row: int) -> int:
        """Book ``pair``'s KV transfer on its DC's link and credit the decode side, ``row`` (the
        placement's instance), with the prompt; the row its prefill runs on (where the rest of
        the send is recorded)."""
        self.links.book(str(view.dc[pair.prefill]), pair.transfer_ready_s, pair.transfer_s)
        self.index.add(view.instance_ids[row], request.block_hashes)
        return pair.prefill

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        """The decode instance of a disaggregated request, bound when its KV cache is ready (a
        decode instance picked at the decision would be stale by then: what was queued on it
        since goes first): of the decided one's DC, the row where its KV is predicted to arrive
        and its last prompt token to be computed soonest (``transfer_s`` of the part it does not
        hold, then ``decode_leg_s``, on ``view`` now)."""
        decided = view.index_of.get(decided_id)
        if decided is None:
            return decided_id
        rows = view.serving_rows(request) & (view.dc == view.dc[decided])
        fixed = self._fixed_for(view)
        at = self._features(request, view, now_s)
        theta_of_row = fixed.thetas[fixed.rows.profiles.of_row]
        cost = decode_leg_s(request, at.features, at.rows, theta_of_row, self._budget)
        gbps = view.dcs.link_gbps(str(view.dc[decided]))
        if gbps > 0:
            cost += transfer_s(view.kv_bytes_per_token.astype(np.float64), at.rows[0], gbps)
        chosen = view.instance_ids[int(np.flatnonzero(rows)[np.argmin(cost[rows])])]
        if chosen != decided_id:
            self.in_flight.move(request, chosen, now_s)
            self.index.add(chosen, request.block_hashes)
        return chosen

    def _prefill_done(self, event: PrefillDone) -> None:
        """A disaggregated request's prefill ended: on its prefill row this is its first token
        and end (θ learns from it there); its later first token and end, on the decode row,
        calibrate nothing (they include the transfer)."""
        key = (event.request_id, event.attempt)
        sent = self._sent.get(key)
        if sent is None or sent.instance_id != event.instance_id:
            return
        self.clock.first_token(key, event.instance_id, event.time_s)
        self.clock.finished(key, event.instance_id, event.time_s, True)
        del self._sent[key]
        self.queues.first_token(sent.instance_id, sent.mark, key)
        if sent.own:
            self._calibrate(sent, event.ttft_s)
        self._observed += 1
