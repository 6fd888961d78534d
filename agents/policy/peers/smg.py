"""The SGLang model gateway's (``lightseekorg/smg``) event-driven cache-aware policy."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import BlocksChanged, ClusterView, Placement, RequestView


class SmgEvents(InstanceSelector):
    """SGLang model gateway (now ``lightseekorg/smg``), ``cache_aware`` policy, event-driven mode.

    Follows ``lightseekorg/smg`` at 73da68ca9472bbc0ff5f63d31a8a21fbb8696359 (2026-08-07, the
    newest stored commit): ``model_gateway/src/policies/cache_aware.rs`` (``select_worker``,
    ``is_imbalanced``, ``select_worker_event_driven``, ``score_overlap``),
    ``crates/kv_index/src/event_tree.rs`` (``PositionalIndexer``: per worker, the consecutive
    leading blocks of the request it holds according to its KV events, ``scores``, and the
    blocks it holds in all, ``tree_sizes``; only full blocks are hashed,
    ``compute_request_content_hashes``), ``model_gateway/src/worker/worker.rs`` (``load``: the
    gateway's count of requests it sent to the worker whose response has not ended;
    ``processed``: requests it routed there), and the shipped defaults of
    ``model_gateway/src/main.rs`` (``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5;
    ``cache_threshold`` plays no part in this mode) and ``model_gateway/src/policies/mod.rs``
    (``balance_token_usage_threshold`` and ``overload_token_usage_threshold`` 1.0: the KV-usage
    imbalance triggers are off, so not modelled).

    Per request, over the candidates:
    1. imbalanced when max(load) - min(load) > 64 and max(load) > 1.5 * min(load): route to the
       least-loaded worker, ties by fewer ``processed``, then the first row.
    2. otherwise, among workers with overlap > 0, the highest (overlap, -load, -tree size),
       the last row among exact ties (Rust's ``max_by_key`` keeps the last maximum).
    3. no worker overlaps (cold start, novel prompt, prompt shorter than a block): the
       least-loaded worker as in 1.
    Every pick adds 1 to the chosen worker's ``processed``.

    Block size: SMG learns the engines' block size from their events (16 by default); our KV
    events and prompt hashes are per 512-token block. Overlap and tree size are counts of
    blocks of one size across workers, so their order is the same at either size, except that
    two workers matching the same number of our blocks may differ by up to 31 16-token blocks
    that we cannot see (ties then go on to load and tree size), and a prompt shorter than 512
    tokens has no overlap here. Departure: before the gateway's event index holds any block,
    SMG routes by its approximate token tree; here by load as in 3 (a start-up transient).

    Several gateway replicas (several deciders per pool): each gateway subscribes to the
    engines' KV events itself and keeps its load counters in its own process; nothing in the
    files above reads another gateway's routing. So another decider's placement (``Placed``)
    is ignored (``shares_placements`` False): each replica counts only its own sends.
    """

    name = "smg-events"
    wants_kv_events = True
    shares_placements = False

    def __init__(
        self, seed: int = 0, balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5
    ) -> None:
        super().__init__(seed)
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.index = PrefixIndex()  # what each worker's KV events say it caches
        self.processed: dict[str, int] = {}

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        load = self.in_flight.per_instance(self.in_flight.requests, view)
        rows = np.flatnonzero(mask).tolist()
        live = load[mask]
        hi, lo = int(live.max()), int(live.min())
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return self._chosen(view, self._least_loaded(rows, load, view), "imbalanced: least loaded")
        overlap = self.index.match_array(request.block_hashes, view)
        matching = [row for row in rows if overlap[row] > 0]
        if not matching:
            return self._chosen(view, self._least_loaded(rows, load, view), "no overlap: least loaded")
        ids = view.instance_ids
        best = max(
            reversed(matching),  # max keeps the first maximum it meets: the last row, as in Rust
            key=lambda row: (int(overlap[row]), -int(load[row]), -self.index.blocks_held(ids[row])),
        )
        return self._chosen(view, best, "highest overlap")

    def _least_loaded(self, rows: list[int], load: np.ndarray, view: ClusterView) -> int:
        """min (load, processed, row) over ``rows``."""
        ids = view.instance_ids
        return min(rows, key=lambda row: (int(load[row]), self.processed.get(ids[row], 0), row))

    def _chosen(self, view: ClusterView, row: int, reason: str) -> Placement:
        instance_id = view.instance_ids[row]
        self.processed[instance_id] = self.processed.get(instance_id, 0) + 1
        return Placement(row, reason)

    def on_kv_event(self, event: BlocksChanged) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)
