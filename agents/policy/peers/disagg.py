"""The peers' prefill/decode disaggregation, rebuilt from their source: llm-d's P/D profile
handler and Dynamo's conditional disaggregation, each with its own scorers on each side.

Both pick the decode instance first among the request's candidates (role ``decode`` or
``both``), then decide by a fixed rule whether a prefill instance (role ``prefill`` or ``both``,
``ClusterView.prefill_rows``, here of the decode instance's DC: a pair never spans DCs) prefills
it; with none to pick, the decode instance prefills it itself (local prefill).
"""

from __future__ import annotations

from agents.policy.common.numeric import BoolArray, pick_max, pick_min
from agents.policy.peers.dynamo import DynamoKv, _tail_tokens
from agents.policy.peers.llmd import LlmdDefault
from agents.policy.types import (
    BLOCK_TOKENS,
    ClusterView,
    Finished,
    Observation,
    Placement,
    PrefillDone,
    RequestView,
)


def _prefill_side(request: RequestView, view: ClusterView, decode_row: int) -> BoolArray:
    """Rows that may prefill ``request`` for ``decode_row``: of its DC, not itself."""
    rows: BoolArray = view.prefill_rows(request) & (view.dc == view.dc[decode_row])
    rows[decode_row] = False
    return rows


class LlmdPd(LlmdDefault):
    """llm-d's P/D profile handler, as shipped.

    Follows ``llm-d/llm-d-router`` at ebab687927f5331c1b39defcb579a07951bce56c (P/D files last
    changed in 229b8ea5): ``pkg/epp/framework/plugins/scheduling/profilehandler/disagg/
    disagg_profile_handler.go`` (decode profile first, then prefill), ``.../disagg/
    prefix_based_pd_decider.go`` (``disaggregate``) and ``deploy/config/pd-epp-config.yaml``
    (commit 33f0dc4a): ``nonCachedTokens`` 16; both profiles ``prefix-cache-scorer`` weight 2
    and ``queue-scorer`` weight 1, max-score picker; the approximate prefix data producer with
    its token cap at 16 384.

    decode d = argmax over the candidates of 2 * prefix_i + 1 * queue_i (``LlmdDefault``'s
    scorers); hit = leading prompt tokens the picker's own index says d holds (at most the
    cap); disaggregate iff input - hit >= ``non_cached_tokens``; then prefill p = argmax of the
    same score over the prefill pool. No prefill pod: decode-only (d's sidecar prefills
    locally). After scheduling the prompt is recorded under d and under p.
    """

    name = "llm-d-pd"

    def __init__(self, seed: int = 0, non_cached_tokens: int = 16, max_prefix_tokens: int = 16384) -> None:
        super().__init__(
            seed, queue_weight=1.0, kv_weight=0.0, prefix_weight=2.0, max_prefix_tokens=max_prefix_tokens
        )
        self.non_cached_tokens = non_cached_tokens
        self._prefill_row = -1

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self._size_index(view)
        decode = pick_max(self.scores(request, view, mask), mask, self.rng)
        self._prefill_row = -1
        if request.input_tokens < self.non_cached_tokens:
            return Placement(decode, "decode only: short prompt")
        hit = BLOCK_TOKENS * int(self.index.match_array(self._hashed(request), view)[decode])
        if request.input_tokens - min(hit, self.max_prefix_tokens) < self.non_cached_tokens:
            return Placement(decode, "decode only: cached on the decode pod")
        prefill_pool = _prefill_side(request, view, decode)
        if not prefill_pool.any():
            return Placement(decode, "decode only: no prefill pod")
        self._prefill_row = pick_max(self.scores(request, view, prefill_pool), prefill_pool, self.rng)
        return Placement(decode, "prefill/decode: uncached part over the threshold", None, self._prefill_row)

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        super().on_routed(request, view, row)
        if self._prefill_row >= 0:
            super().on_routed(request, view, self._prefill_row)


class DynamoDisagg(DynamoKv):
    """Dynamo's conditional disaggregation (``--router-conditional-disagg``) with its default
    policy, ``isl_bounding``, and its KV router on each side.

    Follows ``ai-dynamo/dynamo`` (read through the file index): ``lib/llm/src/kv_router/
    prefill_router/conditional_bypass.rs`` at 07a6c9ce, ``lib/kv-router/src/
    conditional_disagg.rs`` at 48bbf30c, ``lib/llm/src/kv_router/prefill_router/mod.rs`` at
    000bf407, ``lib/kv-router/src/scheduling/selector/default.rs`` at 07a6c9ce.

    decode d = the KV router's argmin over the candidates, overlap credit on (``DynamoKv``);
    eff = input - cached tokens of d (its KV events); local prefill on d (bypass) iff
    eff < ``max_local_prefill_tokens`` (2 048) and eff / input < ``max_uncached_share`` (0.7);
    else prefill p = the KV router's argmin over the prefill pool (its in-flight prefill
    tokens less its overlap, plus its decode blocks). No prefill worker: d prefills locally.
    The prefill leg's tokens leave p's load when its prefill is done (``PrefillDone``); then the
    decode side is routed (``bind_decode``: Dynamo routes decode after the prefill returns), by
    the KV router's argmin, overlap credit kept, over the decode workers of d's DC, with no
    prefill tokens tracked there.
    """

    name = "dynamo-disagg"

    def __init__(
        self,
        seed: int = 0,
        max_local_prefill_tokens: int = 2048,
        max_uncached_share: float = 0.7,
        overlap_score_credit: float = 1.0,
        prefill_load_scale: float = 1.0,
        router_replica_sync: bool = True,
    ) -> None:
        super().__init__(seed, overlap_score_credit, prefill_load_scale, router_replica_sync)
        self.max_local_prefill_tokens = max_local_prefill_tokens
        self.max_uncached_share = max_uncached_share
        self._prefill_row = -1
        self._prefill_overlap = 0

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        decode = pick_min(self.costs(request, view), mask, self.rng)
        self._prefill_row = -1
        uncached = max(request.input_tokens - BLOCK_TOKENS * int(self._overlap[decode]), 0)
        if uncached < self.max_local_prefill_tokens and uncached < self.max_uncached_share * max(
            request.input_tokens, 1
        ):
            return Placement(decode, "local prefill: short uncached part")
        prefill_pool = _prefill_side(request, view, decode)
        if not prefill_pool.any():
            return Placement(decode, "local prefill: no prefill worker")
        decode_overlap = self._overlap
        costs = self.costs(request, view)
        self._prefill_row = pick_min(costs, prefill_pool, self.rng)
        self._prefill_overlap = int(self._overlap[self._prefill_row])
        self._overlap = decode_overlap
        return Placement(decode, "remote prefill", None, self._prefill_row)

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        if self._prefill_row < 0:
            super().on_routed(request, view, row)
            return
        tail = _tail_tokens(request)
        self.active.add(request.key, view.instance_ids[row], request.block_hashes, tail, 0)
        uncached = max(request.input_tokens - BLOCK_TOKENS * self._prefill_overlap, 0)
        prefill_id = view.instance_ids[self._prefill_row]
        self.active.add(_leg(request.key), prefill_id, request.block_hashes, tail, uncached)

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        decided = view.index_of.get(decided_id)
        if decided is None:
            return decided_id
        rows = view.serving_rows(request) & (view.dc == view.dc[decided])
        self.active.free(request.key)  # (its provisional decode entry; re-added where it goes)
        chosen = view.instance_ids[pick_min(self.costs(request, view), rows, self.rng)]
        self.active.add(request.key, chosen, request.block_hashes, _tail_tokens(request), 0)
        if chosen != decided_id:
            self.in_flight.move(request, chosen, now_s)
        return chosen

    def observe(self, event: Observation) -> None:
        if isinstance(event, PrefillDone | Finished):  # (an end: a leg its client gave up on)
            self.active.free(_leg((event.request_id, event.attempt)))
        if not isinstance(event, PrefillDone):
            super().observe(event)


def _leg(key: tuple[str, int]) -> tuple[str, int]:
    """The key a request's prefill leg is tracked under on its prefill worker."""
    return (f"{key[0]}#prefill", key[1])
