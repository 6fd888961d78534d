"""Peer routers, rebuilt from their public descriptions so we can measure against them.

Each class states the rule it implements and where the rule is described. They are faithful to
the decision rule, not to every engineering detail of the original (which is written in Rust or
Go and runs beside a real proxy).
"""

from __future__ import annotations

import numpy as np

from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import BoolArray, Pick, RoutingPolicy, blocks_for, pick_max, pick_min
from agents.policy.types import BLOCK_TOKENS, ClusterView, KvEvent, RequestView


class SglangCacheAware(RoutingPolicy):
    """SGLang router, ``cache_aware`` policy (sgl-router; docs: SGLang "Router" page).

    load_i = requests this router has in flight on instance i. If the load is imbalanced,
    ``max - min > balance_abs_threshold`` (32) and ``max > balance_rel_threshold * min`` (1.1),
    route to the least-loaded instance. Otherwise find the longest prefix match in an approximate
    per-instance prefix tree built from the router's own routing history; if the match rate
    (matched tokens / input tokens) exceeds ``cache_threshold`` (0.5) route to the best-matching
    instance, else to the least-loaded one. The chosen instance's tree learns the prompt.
    """

    name = "sglang-cache-aware"

    def __init__(
        self,
        seed: int = 0,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.1,
    ) -> None:
        super().__init__(seed)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.tree = PrefixIndex()

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        self.tree.size_like(view)
        load = self.in_flight.per_instance(self.in_flight.requests, view).astype(np.float64)
        live = load[mask]
        if (
            live.max() - live.min() > self.balance_abs_threshold
            and live.max() > self.balance_rel_threshold * live.min()
        ):
            return Pick(pick_min(load, mask, self.rng), "imbalanced: least loaded")
        matched = self.tree.match_array(request.block_hashes, view.index_of, len(view))
        matched = np.where(mask, matched, 0)
        best = int(matched.max())
        if best * BLOCK_TOKENS > self.cache_threshold * max(request.input_tokens, 1):
            rows = np.flatnonzero(matched == best)
            # Among equal matches, the least-loaded one (SGLang picks one holder of the match).
            return Pick(pick_min(load, np.isin(np.arange(len(view)), rows), self.rng), "prefix match")
        return Pick(pick_min(load, mask, self.rng), "low match: least loaded")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.tree.add(view.instance_ids[row], request.block_hashes)


class DynamoKv(RoutingPolicy):
    """NVIDIA Dynamo KV-aware router (docs: "KV Cache Routing", components/router).

    cost_i = overlap_weight * max(prefill_blocks - overlap_i, 0) + decode_blocks_i, where
    prefill_blocks = ceil(input / block), overlap_i = leading prompt blocks instance i holds
    according to its KV events, decode_blocks_i = blocks of the sequences this router has in
    flight on i. Argmin; ties broken at random (temperature 0).
    """

    name = "dynamo-kv"
    wants_kv_events = True

    def __init__(self, seed: int = 0, overlap_weight: float = 1.0) -> None:
        super().__init__(seed)
        self.overlap_weight = overlap_weight
        self.index = PrefixIndex()

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        overlap = self.index.match_array(request.block_hashes, view.index_of, len(view))
        prefill = np.maximum(blocks_for(request.input_tokens) - overlap, 0)
        decode = self.in_flight.per_instance(self.in_flight.blocks, view)
        cost = (self.overlap_weight * prefill + decode).astype(np.float64)
        return Pick(pick_min(cost, mask, self.rng), "min prefill+decode blocks")

    def on_kv_event(self, event: KvEvent) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)


class LlmdDefault(RoutingPolicy):
    """llm-d inference scheduler, default scoring profile (llm-d-inference-scheduler docs).

    score_i = 2 * queue_i + 2 * kv_i + 3 * prefix_i, max-score picker with random tie-break:
    queue_i = (max_q - q_i) / (max_q - min_q) over candidates (1 when all equal), q = waiting
    requests from the last metrics scrape; kv_i = 1 - kv_used_i / kv_total_i; prefix_i = matched
    blocks / prompt blocks in an approximate per-pod LRU index of the scheduler's own routing
    history. It reads only scraped metrics, so it does no in-flight accounting of its own.
    """

    name = "llm-d-default"

    def __init__(
        self, seed: int = 0, queue_weight: float = 2.0, kv_weight: float = 2.0, prefix_weight: float = 3.0
    ) -> None:
        super().__init__(seed)
        self.weights = (queue_weight, kv_weight, prefix_weight)
        self.index = PrefixIndex()

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        self.index.size_like(view)
        queue = view.waiting.astype(np.float64)
        lo, hi = queue[mask].min(), queue[mask].max()
        queue_score = (hi - queue) / (hi - lo) if hi > lo else np.ones(len(view))
        kv_score = 1.0 - view.kv_used / np.maximum(view.kv_total, 1)
        total_blocks = max(len(request.block_hashes), 1)
        matched = self.index.match_array(request.block_hashes, view.index_of, len(view))
        prefix_score = matched / total_blocks
        wq, wk, wp = self.weights
        score = wq * queue_score + wk * kv_score + wp * prefix_score
        return Pick(pick_max(score, mask, self.rng), "max weighted score")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.index.add(view.instance_ids[row], request.block_hashes)
