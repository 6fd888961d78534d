"""The llm-d router's (endpoint picker's) scoring profiles, rebuilt from its source."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray, pick_max
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import BLOCK_TOKENS, BlocksChanged, ClusterView, Placement, RequestView


def queue_scores(view: ClusterView, mask: BoolArray) -> FloatArray:
    """llm-d ``queue-scorer``: (max_q - q_i) / (max_q - min_q) over the candidates, 1 for every
    row when all candidates wait equally; q = waiting requests from the last metrics scrape."""
    queue = view.waiting.astype(np.float64)
    lo, hi = queue[mask].min(), queue[mask].max()
    score: FloatArray = (hi - queue) / (hi - lo) if hi > lo else np.ones(len(view))
    return score


def kv_scores(view: ClusterView) -> FloatArray:
    """llm-d ``kv-cache-utilization-scorer``: 1 - KV-cache usage (fraction) from the last scrape."""
    score: FloatArray = 1.0 - view.kv_used / np.maximum(view.kv_total, 1)
    return score


class _LlmdProfile(InstanceSelector):
    """One llm-d scheduling profile: weighted scorers, then the ``max-score-picker``.

    score_i = w_queue * queue_i + w_kv * kv_i + w_prefix * prefix_i (each scorer's output is
    clamped to [0, 1] by the framework, ``enforceScoreRange``; these already are), and the
    picker shuffles the candidates before a stable sort by score, so ties are broken uniformly
    at random. Subclasses say where ``prefix_i`` comes from.

    Several endpoint-picker replicas (several deciders per pool): by default a multi-replica
    EPP elects a leader and only it routes (active-passive); in the active-active mode every
    replica routes, each scraping the metrics itself and keeping its prefix index itself:
    nothing about routing is shared between replicas (llm-d router operations guide,
    https://llm-d.ai/docs/0.10/operations/router, "High Availability & Scaling Modes"). So
    another decider's placement (``Placed``) is ignored (``shares_placements`` False).
    """

    shares_placements = False

    def __init__(self, seed: int, queue_weight: float, kv_weight: float, prefix_weight: float) -> None:
        super().__init__(seed)
        self.weights = (queue_weight, kv_weight, prefix_weight)

    def prefix_scores(self, request: RequestView, view: ClusterView) -> FloatArray:
        raise NotImplementedError

    def scores(self, request: RequestView, view: ClusterView, mask: BoolArray) -> FloatArray:
        wq, wk, wp = self.weights
        prefix = self.prefix_scores(request, view)
        score: FloatArray = wq * queue_scores(view, mask) + wk * kv_scores(view) + wp * prefix
        return score

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        return Placement(pick_max(self.scores(request, view, mask), mask, self.rng), "max weighted score")


class LlmdDefault(_LlmdProfile):
    """llm-d router (endpoint picker), default scheduling profile, at its newest defaults.

    Follows ``llm-d/llm-d-router`` at ebab687927f5331c1b39defcb579a07951bce56c (2026-08-21,
    the newest stored commit; the picker moved there from ``llm-d/llm-d-inference-scheduler``):
    ``config/charts/routerlib/templates/_config.yaml`` (default profile, latency predictor off
    as ``values.yaml`` ships it: ``queue-scorer`` weight 2, ``kv-cache-utilization-scorer`` 2,
    ``prefix-cache-scorer`` 3, max-score picker), ``pkg/epp/framework/plugins/scheduling/
    scorer/{queuedepth,kvcacheutilization,prefix}`` (prefix: ``matchLengthWeight`` 0, so the
    match ratio alone), ``pkg/epp/framework/plugins/requestcontrol/dataproducer/
    approximateprefix/{types,plugin}.go`` and ``.../dataproducer/prefixhash/hashing.go``:
    ``maxPrefixTokensToMatch`` 131 072 (change c98379e2b09fa4019a8ac5603ed6fc25ccc82f7a,
    #1548, which made the token cap the default over the block cap), block size the engine's
    reported block size floored at ``minBlockSizeTokens`` 64 (change
    44582a8f468c1ddbe8fec6a5862e128d1d2cdac7, #1160: vLLM's 16 becomes 64), ``autoTune`` on,
    so each pod's LRU holds as many entries as the pod reports ``num_gpu_blocks`` (engine
    blocks of 16 tokens; each entry is a 64-token block, so the LRU covers 4x the pod's KV
    tokens). Metrics refresh every 50 ms (``pkg/epp/datalayer/runtime.go``,
    ``defaultRefreshInterval``); here they are as fresh as the simulator's heartbeats
    (``--heartbeat 0.05`` for llm-d's own rate).

    prefix_i = matched / total, total = ceil(min(isl, 131072) / 64) (the partial last block is
    hashed too), matched = leading blocks in an LRU index of the picker's own routing history
    (each routed prompt's hashed blocks are added for its pod; ``PreRequest``); 0 when nothing
    is hashed. queue_i and kv_i as ``queue_scores`` and ``kv_scores``.
    score_i = 2 * queue_i + 2 * kv_i + 3 * prefix_i.

    Block size: our prompt hashes cover 512-token blocks, so a match of k of them is k * 8 of
    llm-d's 64-token blocks, and the 131 072-token cap is our first 256 blocks; a match
    shorter than one of our blocks is not seen. LRU capacity in our blocks: kv_total *
    block_size_tokens / engine_block_tokens. It reads only scraped metrics: no in-flight
    accounting. Replicas share nothing (``_LlmdProfile``).

    ``LlmdDefault4k`` (``llm-d-default-4k``) keeps the older defaults (16-token blocks, 4 096
    tokens) as a labelled variant.
    """

    name = "llm-d-default"

    def __init__(
        self,
        seed: int = 0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        prefix_weight: float = 3.0,
        block_size_tokens: int = 64,
        max_prefix_tokens: int = 131072,
        engine_block_tokens: int = 16,
    ) -> None:
        super().__init__(seed, queue_weight, kv_weight, prefix_weight)
        self.block_size_tokens = block_size_tokens
        self.max_prefix_tokens = max_prefix_tokens
        # One LRU entry per engine block the pod reports, each entry one llm-d block.
        self.lru_scale = block_size_tokens / engine_block_tokens
        self.index = PrefixIndex()
        self._sized_for = -1

    def prefix_scores(self, request: RequestView, view: ClusterView) -> FloatArray:
        """matched / total llm-d blocks of the prompt's first ``max_prefix_tokens`` tokens."""
        considered = min(request.input_tokens, self.max_prefix_tokens)
        if considered < self.block_size_tokens:
            # Only a partial block is hashed; our 512-token hashes never match it.
            return np.zeros(len(view))
        total = -(-considered // self.block_size_tokens)  # llm-d hashes the partial block too
        matched = self.index.match_array(self._hashed(request), view)
        llmd_blocks = matched * (BLOCK_TOKENS // self.block_size_tokens)
        score: FloatArray = np.minimum(llmd_blocks, total) / total
        return score

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self._size_index(view)
        return super().pick(request, view, mask, now_s)

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.index.add(view.instance_ids[row], self._hashed(request))

    def _hashed(self, request: RequestView) -> tuple[int, ...]:
        """The prompt blocks llm-d hashes: those inside its first ``max_prefix_tokens`` tokens."""
        return request.block_hashes[: self.max_prefix_tokens // BLOCK_TOKENS]

    def _size_index(self, view: ClusterView) -> None:
        """Each pod's LRU capacity from its reported KV size (once per snapshot)."""
        if self._sized_for == view.version:
            return
        for instance_id, kv_total in zip(view.instance_ids, view.kv_total.tolist(), strict=True):
            self.index.set_capacity(instance_id, max(round(kv_total * self.lru_scale), 1))
        self._sized_for = view.version


class LlmdDefault4k(LlmdDefault):
    """``llm-d-default`` at its older defaults, a labelled variant (not llm-d's newest).

    ``llm-d/llm-d-inference-scheduler`` at 520af47896e5f06e43d09aca281a1149187b0ffd
    (2026-05-17): the same profile (weights 2 / 2 / 3) and scorers, but 16-token blocks
    (``blockSizeTokens`` 16, no floor yet) and ``maxPrefixBlocksToMatch`` 256, so only the
    prompt's first 256 * 16 = 4 096 tokens are hashed (our first 8 blocks, each match of
    ours 32 llm-d blocks), and each pod's LRU holds ``num_gpu_blocks`` 16-token entries (its
    KV size). Prompts sharing their first 4 096 tokens look alike, however long the match.
    """

    name = "llm-d-default-4k"

    def __init__(
        self,
        seed: int = 0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        prefix_weight: float = 3.0,
        block_size_tokens: int = 16,
        max_prefix_tokens: int = 4096,
        engine_block_tokens: int = 16,
    ) -> None:
        super().__init__(
            seed,
            queue_weight,
            kv_weight,
            prefix_weight,
            block_size_tokens,
            max_prefix_tokens,
            engine_block_tokens,
        )


class LlmdLoadAware(LlmdDefault):
    """llm-d with the estimated prefix cache and the load-aware scorer, a shipped alternative
    profile (not the default): ``deploy/config/epp-estimate-prefix-cache-config.yaml`` of
    ``llm-d/llm-d-router`` at ebab687927f5331c1b39defcb579a07951bce56c (unchanged since
    ``llm-d-inference-scheduler`` 520af478): ``prefix-cache-scorer`` weight 1 and
    ``load-aware-scorer`` weight 1, max-score picker; the load-aware scorer
    (``pkg/epp/framework/plugins/scheduling/scorer/loadaware/load_aware.go``,
    ``queueThreshold`` 128) gives 0.5 to an empty queue and 0.5 * (1 - min(q, 128) / 128)
    otherwise, q = waiting requests from the last scrape.

    score_i = 1 * prefix_i + 1 * load_i; prefix_i as in ``LlmdDefault`` (newest defaults:
    64-token blocks, 131 072 tokens).
    """

    name = "llm-d-load-aware"

    def __init__(
        self,
        seed: int = 0,
        prefix_weight: float = 1.0,
        load_weight: float = 1.0,
        queue_threshold: int = 128,
        block_size_tokens: int = 64,
        max_prefix_tokens: int = 131072,
    ) -> None:
        super().__init__(
            seed,
            prefix_weight=prefix_weight,
            block_size_tokens=block_size_tokens,
            max_prefix_tokens=max_prefix_tokens,
        )
        self.load_weight = load_weight
        self.queue_threshold = queue_threshold

    def scores(self, request: RequestView, view: ClusterView, mask: BoolArray) -> FloatArray:
        waiting = np.minimum(view.waiting.astype(np.float64), self.queue_threshold)
        load = np.where(waiting == 0, 0.5, 0.5 * (1.0 - waiting / self.queue_threshold))
        score: FloatArray = self.weights[2] * self.prefix_scores(request, view) + self.load_weight * load
        return score


class LlmdPrecise(_LlmdProfile):
    """llm-d router, precise prefix-cache profile: prefix matches from the engines' KV events.

    Follows ``llm-d/llm-d-router`` at ebab687927f5331c1b39defcb579a07951bce56c:
    ``deploy/config/epp-precise-prefix-cache-config.yaml`` (``decode-filter``, then
    ``prefix-cache-scorer`` weight 2 fed by ``precise-prefix-cache-producer``,
    ``kv-cache-utilization-scorer`` 1, ``queue-scorer`` 1, ``max-score-picker``; token
    processor ``blockSize`` 64, speculative indexing off), ``pkg/epp/framework/plugins/
    requestcontrol/dataproducer/preciseprefixcache/producer.go`` (match info per endpoint:
    matched = the KV-block scorer's score, total = the prompt's block keys),
    ``pkg/kvcache/kvblock_scorer.go`` (``LongestPrefix``: per pod, the sum of tier weights of
    the consecutive leading blocks it holds, GPU weight 1.0, CPU 0.8 — ``pkg/kvcache/
    backend.go``), ``pkg/kvcache/kvblock/token_processor.go`` (only full blocks get a key),
    and the scorers and picker of ``LlmdDefault``.

    prefix_i = matched_i / total, total = floor(isl / 64), matched_i = leading 64-token blocks
    of the prompt that pod i holds according to its KV events (GPU tier only here: weight 1
    per block); 0 when total is 0. No token cap, no LRU of its own: the index forgets a block
    when the engine reports it removed.
    score_i = 2 * prefix_i + 1 * kv_i + 1 * queue_i, max-score picker, random tie-break.

    Block size: the profile's 64-token blocks must equal the engines' KV blocks (the guide
    deploys vLLM with ``--block-size 64``); our KV events and prompt hashes are per 512-token
    block, so a match of k of ours is k * 8 of llm-d's, and up to 7 full 64-token blocks of
    the prompt's tail (after its last full 512-token block) count in total but never match.
    The decode filter passes every instance (no prefill/decode roles here). Like the other
    llm-d profiles it reads only scraped metrics and events (no in-flight accounting) and
    replicas share nothing but the events, which every replica subscribes to itself
    (``_LlmdProfile``: ``Placed`` ignored).
    """

    name = "llm-d-precise"
    wants_kv_events = True

    def __init__(
        self,
        seed: int = 0,
        prefix_weight: float = 2.0,
        kv_weight: float = 1.0,
        queue_weight: float = 1.0,
        block_size_tokens: int = 64,
    ) -> None:
        super().__init__(seed, queue_weight, kv_weight, prefix_weight)
        self.block_size_tokens = block_size_tokens
        self.index = PrefixIndex()  # what each pod's KV events say it caches

    def prefix_scores(self, request: RequestView, view: ClusterView) -> FloatArray:
        """matched / total 64-token blocks of the whole prompt, from the KV events."""
        total = request.input_tokens // self.block_size_tokens
        if total == 0:
            return np.zeros(len(view))
        matched = self.index.match_array(request.block_hashes, view)
        llmd_blocks = matched * (BLOCK_TOKENS // self.block_size_tokens)
        score: FloatArray = np.minimum(llmd_blocks, total) / total
        return score

    def on_kv_event(self, event: BlocksChanged) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)
