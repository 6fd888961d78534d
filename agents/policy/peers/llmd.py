"""The llm-d inference scheduler's default scoring profile, rebuilt from its source."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray, pick_max
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import BLOCK_TOKENS, ClusterView, Placement, RequestView


class LlmdDefault(InstanceSelector):
    """llm-d inference scheduler (endpoint picker), default scheduling profile.

    Follows ``llm-d/llm-d-inference-scheduler`` at 520af47896e5f06e43d09aca281a1149187b0ffd
    (the endpoint picker and its plugins now live there; the copy in
    ``kubernetes-sigs/gateway-api-inference-extension`` at
    84436a96b9e6ce2b59ddacd3d04c31b4fbd442de keeps only the API and proposals):
    ``config/charts/epplib/templates/_config.yaml`` (default profile: ``queue-scorer`` weight 2,
    ``kv-cache-utilization-scorer`` 2, ``prefix-cache-scorer`` 3, max-score picker),
    ``pkg/epp/framework/plugins/scheduling/scorer/{queuedepth,kvcacheutilization,prefix}``, and
    ``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/{types,hashing,
    plugin}.go`` (``blockSizeTokens`` 16, ``maxPrefixBlocksToMatch`` 256, ``autoTune`` on, so
    the per-server LRU holds the server's reported ``num_gpu_blocks``; 31250 only without that
    metric). Metrics refresh every 50 ms (``pkg/epp/datalayer/runtime.go``,
    ``RefreshMetricsInterval``); here they are as fresh as the simulator's heartbeats.

    score_i = 2 * queue_i + 2 * kv_i + 3 * prefix_i, max-score picker with random tie-break:
    queue_i = (max_q - q_i) / (max_q - min_q) over candidates (1 when all equal), q = waiting
    requests from the last scrape; kv_i = 1 - kv_used_i / kv_total_i; prefix_i = matched /
    total 16-token blocks of the prompt's first 256 * 16 = 4096 tokens (0 below 16 tokens),
    matched = leading blocks in an LRU index of the scheduler's own routing history (each
    routed prompt's first 4096 tokens are added for its pod; capacity = the pod's KV blocks).

    Block size: our prompt hashes cover 512-token blocks, so a match of k of them is k * 32
    of llm-d's blocks, and the 4096-token cap is our first 8 blocks; a match shorter than one
    of our blocks is not seen. It reads only scraped metrics: no in-flight accounting.

    Several endpoint-picker replicas (several deciders per pool): by default a multi-replica
    EPP elects a leader and only it routes (active-passive); in the active-active mode every
    replica routes, each scraping the metrics itself and keeping the approximate prefix index
    of its own routing history: nothing is shared between replicas (llm-d router operations
    guide, https://llm-d.ai/docs/0.10/operations/router, "High Availability & Scaling Modes").
    So another decider's placement (``Placed``) is ignored.
    """

    name = "llm-d-default"
    shares_placements = False

    def __init__(
        self,
        seed: int = 0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        prefix_weight: float = 3.0,
        block_size_tokens: int = 16,
        max_prefix_blocks: int = 256,
    ) -> None:
        super().__init__(seed)
        self.weights = (queue_weight, kv_weight, prefix_weight)
        self.block_size_tokens = block_size_tokens
        self.max_prefix_tokens = block_size_tokens * max_prefix_blocks
        self.index = PrefixIndex()

    def prefix_scores(self, request: RequestView, view: ClusterView) -> FloatArray:
        """matched / total llm-d blocks of the prompt's first ``max_prefix_tokens`` tokens."""
        considered = min(request.input_tokens, self.max_prefix_tokens)
        if considered < self.block_size_tokens:
            return np.zeros(len(view))
        total = -(-considered // self.block_size_tokens)  # llm-d hashes the partial block too
        matched = self.index.match_array(self._hashed(request), view)
        llmd_blocks = matched * (BLOCK_TOKENS // self.block_size_tokens)
        score: FloatArray = np.minimum(llmd_blocks, total) / total
        return score

    def scores(self, request: RequestView, view: ClusterView, mask: BoolArray) -> FloatArray:
        queue = view.waiting.astype(np.float64)
        lo, hi = queue[mask].min(), queue[mask].max()
        queue_score = (hi - queue) / (hi - lo) if hi > lo else np.ones(len(view))
        kv_score = 1.0 - view.kv_used / np.maximum(view.kv_total, 1)
        wq, wk, wp = self.weights
        score: FloatArray = wq * queue_score + wk * kv_score + wp * self.prefix_scores(request, view)
        return score

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self.index.size_like(view)
        return Placement(pick_max(self.scores(request, view, mask), mask, self.rng), "max weighted score")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.index.add(view.instance_ids[row], self._hashed(request))

    def _hashed(self, request: RequestView) -> tuple[int, ...]:
        """The prompt blocks llm-d hashes: those inside its first ``max_prefix_tokens`` tokens."""
        return request.block_hashes[: self.max_prefix_tokens // BLOCK_TOKENS]


class LlmdLoadAware(LlmdDefault):
    """llm-d with the estimated prefix cache and the load-aware scorer, a shipped alternative
    profile (not the default): ``deploy/config/epp-estimate-prefix-cache-config.yaml`` at
    520af47896e5f06e43d09aca281a1149187b0ffd, ``prefix-cache-scorer`` weight 1 and
    ``load-aware-scorer`` weight 1, max-score picker; the load-aware scorer
    (``scorer/loadaware/load_aware.go``, ``queueThreshold`` 128) gives 0.5 to an empty queue
    and 0.5 * (1 - min(q, 128) / 128) otherwise, q = waiting requests from the last scrape.

    score_i = 1 * prefix_i + 1 * load_i; prefix_i as in ``LlmdDefault``.
    """

    name = "llm-d-load-aware"

    def __init__(
        self,
        seed: int = 0,
        prefix_weight: float = 1.0,
        load_weight: float = 1.0,
        queue_threshold: int = 128,
        block_size_tokens: int = 16,
        max_prefix_blocks: int = 256,
    ) -> None:
        super().__init__(
            seed,
            prefix_weight=prefix_weight,
            block_size_tokens=block_size_tokens,
            max_prefix_blocks=max_prefix_blocks,
        )
        self.load_weight = load_weight
        self.queue_threshold = queue_threshold

    def scores(self, request: RequestView, view: ClusterView, mask: BoolArray) -> FloatArray:
        waiting = np.minimum(view.waiting.astype(np.float64), self.queue_threshold)
        load = np.where(waiting == 0, 0.5, 0.5 * (1.0 - waiting / self.queue_threshold))
        score: FloatArray = self.weights[2] * self.prefix_scores(request, view) + self.load_weight * load
        return score
