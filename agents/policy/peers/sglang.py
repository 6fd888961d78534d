"""SGLang router's ``cache_aware`` policy, rebuilt from its public description."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, pick_min
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import BLOCK_TOKENS, ClusterView, Placement, RequestView


class SglangCacheAware(InstanceSelector):
    """SGLang router, ``cache_aware`` policy.

    Follows: ``sgl-project/sglang`` at commit a0160ca43a75b83130ad9745fb85a7cedc3e47fe,
    ``rust/README.md`` (sglang-router's "Strategy" and ``launch_router --help``). Shipped
    defaults there: ``cache_threshold`` 0.5, ``balance_abs_threshold`` 32,
    ``balance_rel_threshold`` 1.0001, tree eviction every 60 s, ``max_tree_size`` 2^24, and a
    low match goes to the worker with the *smallest tree*. This class departs from them — rel
    threshold 1.1, a low match goes to the least-loaded worker, no tree eviction — and so is
    not yet faithful; issue 10 ("fair arena") makes it follow the current release.

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

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        self.tree.size_like(view)
        load = self.in_flight.per_instance(self.in_flight.requests, view).astype(np.float64)
        live = load[mask]
        if (
            live.max() - live.min() > self.balance_abs_threshold
            and live.max() > self.balance_rel_threshold * live.min()
        ):
            return Placement(pick_min(load, mask, self.rng), "imbalanced: least loaded")
        matched = self.tree.match_array(request.block_hashes, view)
        matched = np.where(mask, matched, 0)
        best = int(matched.max())
        if best * BLOCK_TOKENS > self.cache_threshold * max(request.input_tokens, 1):
            rows = np.flatnonzero(matched == best)
            # Among equal matches, the least-loaded one (SGLang picks one holder of the match).
            return Placement(pick_min(load, np.isin(np.arange(len(view)), rows), self.rng), "prefix match")
        return Placement(pick_min(load, mask, self.rng), "low match: least loaded")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        self.tree.add(view.instance_ids[row], request.block_hashes)
