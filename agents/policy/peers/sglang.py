"""SGLang router's ``cache_aware`` policy, rebuilt from its source."""

from __future__ import annotations

from typing import Literal

import numpy as np

from agents.policy.common.numeric import BoolArray, pick_min
from agents.policy.common.selector import InstanceSelector
from agents.policy.peers.approx_tree import ApproxTrees
from agents.policy.types import BLOCK_TOKENS, ClusterView, Placement, RequestView

CHARS_PER_TOKEN = 4
"""SGLang's tree counts prompt characters; we count tokens and convert at 4 characters per token
(the estimate llm-d uses for the same purpose, ``averageCharactersPerToken``)."""

LowMatch = Literal["smallest_tree", "least_loaded"]


class SglangCacheAware(InstanceSelector):
    """SGLang router, ``cache_aware`` policy.

    Follows ``sgl-project/sglang`` (read through the file index; the repository is too large to
    mirror): ``sgl-router/src/policies/cache_aware.rs`` at
    026f853ba7ae08a457a2e127b85a26256a29e300 (``select_worker``),
    ``sgl-router/src/policies/tree.rs`` at 4d40eec0266be06d0e65b919457691cab9e51547 (``insert``,
    ``prefix_match``, ``evict_tenant_by_size``, ``get_smallest_tenant``) and the shipped defaults
    of ``sgl-router/py_src/sglang_router/router_args.py`` at
    083d601378d0baaef6191e7f2d40fb70d06518af: ``cache_threshold`` 0.3,
    ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5, ``eviction_interval_secs``
    120, ``max_tree_size`` 2^26 characters.

    load_i = requests this router sent to i whose response has not ended (the worker's load
    counter). Imbalanced when ``max - min > 64`` and ``max > 1.5 * min`` over the candidates:
    route to the least-loaded one. Otherwise take the longest prefix any candidate's tree holds;
    if the match rate (matched tokens / input tokens; SGLang uses characters) exceeds 0.3, route
    to a candidate holding it, else to the candidate with the smallest tree. Every routed prompt
    is inserted into its worker's tree; a prefix match refreshes the matched worker's path.
    Every 120 s of simulated time, each tree above 2^26 / 4 = 2^24 tokens loses its least
    recently accessed leaves until it fits (see ``ApproxTrees``). Ties (SGLang takes the first
    worker in a hash map's order) are broken uniformly at random.

    Departures: the tree is at the granularity of our 512-token prompt blocks (plus one leaf per
    prompt for its tail), so matches shorter than a block are not seen. ``low_match``: the
    ``sgl-router`` release above sends a low match to the smallest tree (the default here); the
    later ``sgl-model-gateway/src/policies/cache_aware.rs`` (b93974f140de1e545d9134d87e77f0bd1fbf3014)
    sends it to the least-loaded worker instead, available as ``low_match="least_loaded"``.

    Several router replicas (several deciders per pool): the router keeps its load counters and
    trees in its own process and shares them with no other replica (nothing in the files above
    publishes or reads another router's routing), so another decider's placement (``Placed``)
    is ignored, not even counted in flight: each replica knows only its own sends. (The mesh
    of ``lightseekorg/smg``, the gateway's later home, replicates cache-aware trees between
    gateway nodes; that is a later product, not followed here.)
    """

    name = "sglang-cache-aware"
    default_low_match: LowMatch = "smallest_tree"
    shares_placements = False

    def __init__(
        self,
        seed: int = 0,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size_chars: int = 2**26,
        low_match: LowMatch | None = None,
    ) -> None:
        super().__init__(seed)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_tokens = max_tree_size_chars // CHARS_PER_TOKEN
        self.low_match = low_match or self.default_low_match
        self.trees = ApproxTrees()
        self._next_eviction_s: float | None = None
        self._now_s = 0.0

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self._now_s = now_s
        self._maybe_evict(now_s)
        load = self.in_flight.per_instance(self.in_flight.requests, view).astype(np.float64)
        live = load[mask]
        hi, lo = live.max(), live.min()
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return Placement(pick_min(load, mask, self.rng), "imbalanced: least loaded")
        matched = np.where(mask, self.trees.match_array(request.block_hashes, view), 0)
        best = int(matched.max())
        rate = best * BLOCK_TOKENS / request.input_tokens if request.input_tokens > 0 else 0.0
        if best > 0:
            holder = pick_min(np.zeros(len(view)), matched == best, self.rng)
            self.trees.touch(view.instance_ids[holder], request.block_hashes[:best], now_s)
            if rate > self.cache_threshold:
                return Placement(holder, "prefix match")
        if self.low_match == "least_loaded":
            return Placement(pick_min(load, mask, self.rng), "low match: least loaded")
        sizes = self.trees.sizes(view).astype(np.float64)
        return Placement(pick_min(sizes, mask, self.rng), "low match: smallest tree")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        tail = max(request.input_tokens - BLOCK_TOKENS * len(request.block_hashes), 0)
        self.trees.insert(view.instance_ids[row], request.block_hashes, tail, self._now_s)

    def _maybe_evict(self, now_s: float) -> None:
        """The eviction thread, in simulated time: first run one interval after the first pick."""
        if self.eviction_interval_s <= 0:
            return
        if self._next_eviction_s is None:
            self._next_eviction_s = now_s + self.eviction_interval_s
        if now_s >= self._next_eviction_s:
            self.trees.evict(self.max_tree_tokens)
            missed = (now_s - self._next_eviction_s) // self.eviction_interval_s
            self._next_eviction_s += (missed + 1) * self.eviction_interval_s


class SglangGatewayCacheAware(SglangCacheAware):
    """The same policy as the later SGLang model gateway ships it: ``sgl-project/sglang``
    ``sgl-model-gateway/src/policies/cache_aware.rs`` at
    b93974f140de1e545d9134d87e77f0bd1fbf3014, where a low match goes to the least-loaded
    worker instead of the smallest tree. Shipped defaults, the same as the router's
    (``sgl-model-gateway/src/main.rs`` at f47e04e04c2a9408b8b106fb62612daa45d4b067, ``CliArgs``):
    ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
    ``eviction_interval`` 120 s, ``max_tree_size`` 67 108 864 (2^26). Departures: those of
    ``SglangCacheAware``."""

    name = "sglang-gateway-cache-aware"
    default_low_match: LowMatch = "least_loaded"
