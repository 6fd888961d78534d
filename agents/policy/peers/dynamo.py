"""NVIDIA Dynamo's KV-aware router, rebuilt from its public description."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, blocks_for, pick_min
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import BlocksChanged, ClusterView, Placement, RequestView


class DynamoKv(InstanceSelector):
    """NVIDIA Dynamo KV-aware router.

    Follows: ``ai-dynamo/dynamo`` at commit 615bfede9516f275f02ba46f21322e933e5633dd,
    ``docs/architecture/kv_cache_routing.md``. Shipped defaults there:
    ``--kv-overlap-score-weight`` 1, ``--router-temperature`` 0 (deterministic argmin), KV
    events on. Departure: decode blocks here are the raw prompt blocks of this router's own
    in-flight requests, and the in-flight prefill of other requests is not counted (issue 10
    makes it follow ``lib/kv-router``'s selector and active-sequence accounting).

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

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        overlap = self.index.match_array(request.block_hashes, view)
        prefill = np.maximum(blocks_for(request.input_tokens) - overlap, 0)
        decode = self.in_flight.per_instance(self.in_flight.blocks, view)
        cost = (self.overlap_weight * prefill + decode).astype(np.float64)
        return Placement(pick_min(cost, mask, self.rng), "min prefill+decode blocks")

    def on_kv_event(self, event: BlocksChanged) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)
