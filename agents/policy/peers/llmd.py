"""The llm-d inference scheduler's default scoring profile, rebuilt from its public description."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, pick_max
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import ClusterView, Placement, RequestView


class LlmdDefault(InstanceSelector):
    """llm-d inference scheduler, default scoring profile.

    Follows: ``llm-d/llm-d-inference-scheduler`` at commit
    602fe29392bf091671dadf80413e4e859fe725ac, ``docs/architecture.md`` (queue scorer weight 2,
    KV-cache-utilisation scorer 2, prefix-cache scorer 3, max-score picker). Departures: the
    prefix score is not capped at the shipped 256 blocks of 16 tokens, and metrics refresh at
    the simulator's heartbeat, not llm-d's 50 ms (issue 10).

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

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self.index.size_like(view)
        queue = view.waiting.astype(np.float64)
        lo, hi = queue[mask].min(), queue[mask].max()
        queue_score = (hi - queue) / (hi - lo) if hi > lo else np.ones(len(view))
        kv_score = 1.0 - view.kv_used / np.maximum(view.kv_total, 1)
        total_blocks = max(len(request.block_hashes), 1)
        matched = self.index.match_array(request.block_hashes, view)
        prefix_score = matched / total_blocks
        wq, wk, wp = self.weights
        score = wq * queue_score + wk * kv_score + wp * prefix_score
        return Placement(pick_max(score, mask, self.rng), "max weighted score")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.index.add(view.instance_ids[row], request.block_hashes)
