"""NVIDIA Dynamo's KV-aware router (``DefaultWorkerSelector``), rebuilt from its source."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray, pick_min
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.selector import InstanceSelector
from agents.policy.peers.active_sequences import ActiveSequences
from agents.policy.types import (
    BLOCK_TOKENS,
    BlocksChanged,
    ClusterView,
    Finished,
    FirstToken,
    Observation,
    Placed,
    Placement,
    RequestView,
)


class DynamoKv(InstanceSelector):
    """NVIDIA Dynamo KV router, default worker selector.

    Follows ``ai-dynamo/dynamo`` (read through the file index; the repository is too large to
    mirror): ``lib/kv-router/src/scheduling/selector.rs`` at
    01690d42e3b9436ab3a6a365fc9beabf58c105c6 (``worker_logit``, ``select_worker``),
    ``lib/kv-router/src/scheduling/config.rs`` at 0243c51bb6e8958be89df4978b5761677c9adc23
    (``KvRouterConfig::default``), ``lib/kv-router/src/sequences/single.rs`` at
    04df1c42f2fedff2286f46f13efcc96ec32a55bd (``ActiveSequences``, which replaced
    ``lib/llm/src/kv_router/sequence.rs``), and ``lib/llm/src/kv_router.rs``
    (``prefill_load_hint_for``). Shipped defaults: ``overlap_score_credit`` 1,
    ``prefill_load_scale`` 1 (the deprecated ``overlap_score_weight`` now sets it),
    ``overlap_score_credit_decay`` 0, ``decode_active_request_weight`` 0,
    ``router_temperature`` 0, KV events on, active-block and prefill-token tracking on, output
    blocks not tracked, no prefill-load model (no decay), host/disk/shared tiers absent.

    cost_i = prefill_load_scale * max((P_i + isl) / B - credit * overlap_i, 0) + D_i, argmin,
    ties broken uniformly at random (temperature 0). isl = input tokens; overlap_i = leading
    prompt blocks worker i holds according to its KV events; P_i = in-flight prefill tokens:
    for each request this router sent to i and has seen no first token (nor end) of, its
    uncached tokens isl - B * overlap at the time it was routed; D_i = decode blocks: distinct
    prompt blocks of the requests the router has in flight on i (a block hash shared by two
    of them counts once) plus this request's blocks not among them.

    Block size: Dynamo's B is the engine's KV block (16 tokens on vLLM); ours is
    ``BLOCK_TOKENS`` (512), the granularity of the prompt hashes. Every term is a token count
    divided by B, so the argmin does not depend on B except through partial blocks; to keep a
    prompt's last partial block (and prompts shorter than one of our blocks) in the decode
    term, as 16-token blocks would to within 15 tokens, each request contributes its tail
    tokens / 512 as a fractional block (tails are never shared).

    Several router replicas (several deciders per pool): with ``router_replica_sync`` each
    replica publishes its active-sequence changes and the others apply them
    (``lib/kv-router/src/sequences/replica_sync.rs`` at
    057096c31e3cb60ed3bc7c62ceb6846fbdb29ad0, ``apply_replica_event``: a peer's ``AddRequest``
    joins its worker's active set with the peer's prefill-load hint, ``MarkPrefillCompleted``
    and ``Free`` take it out), while KV events reach every replica anyway (the router-operations
    guide: prefix cache state is shared through the event plane, active block state only by
    replica sync). So another decider's placement (``Placed``) joins ``ActiveSequences`` as an
    own ``add`` would: its prompt blocks, and its uncached tokens by this replica's overlap on
    that worker when it is read (the peer's hint was computed on the same KV events). Its first
    token and end clear it as for an own request. ``router_replica_sync`` ships off
    (``KvRouterConfig::default``, ``DYN_ROUTER_REPLICA_SYNC`` false); it is on here by default,
    the configuration the guide gives for several replicas (off: a replica ignores ``Placed``
    and knows only its own sends). With one decider it changes nothing.

    Departures: no router-side queue (``router_queue_threshold`` 16 holds requests only when
    every worker has 16x its batched-token budget in flight).
    """

    name = "dynamo-kv"
    wants_kv_events = True

    def __init__(
        self,
        seed: int = 0,
        overlap_score_credit: float = 1.0,
        prefill_load_scale: float = 1.0,
        router_replica_sync: bool = True,
    ) -> None:
        super().__init__(seed)
        self.overlap_score_credit = overlap_score_credit
        self.prefill_load_scale = prefill_load_scale
        self.shares_placements = router_replica_sync
        self.index = PrefixIndex()  # what each worker's KV events say it caches
        self.active = ActiveSequences()
        self._overlap = np.zeros(0, dtype=np.int64)  # of the request being placed, per row

    def costs(self, request: RequestView, view: ClusterView) -> FloatArray:
        """The logit of every row (lower is better)."""
        overlap = self.index.match_array(request.block_hashes, view)
        self._overlap = overlap
        prefill_tokens, active_blocks, active_tails = self.active.loads(view)
        raw_prefill = (prefill_tokens + request.input_tokens) / BLOCK_TOKENS
        prefill = np.maximum(raw_prefill - self.overlap_score_credit * overlap, 0.0)
        shared = self.active.shared(request.block_hashes, view)
        new_blocks = len(request.block_hashes) - shared + _tail_tokens(request) / BLOCK_TOKENS
        decode = active_blocks + active_tails / BLOCK_TOKENS + new_blocks
        cost: FloatArray = self.prefill_load_scale * prefill + decode
        return cost

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        return Placement(pick_min(self.costs(request, view), mask, self.rng), "min prefill+decode cost")

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        cached = BLOCK_TOKENS * int(self._overlap[row]) if len(self._overlap) == len(view) else 0
        self.active.add(
            request.key,
            view.instance_ids[row],
            request.block_hashes,
            _tail_tokens(request),
            max(request.input_tokens - cached, 0),
        )

    def on_placed_elsewhere(self, event: Placed) -> None:
        """A peer replica's ``AddRequest`` (class docstring): the request joins the worker's
        active set, with its uncached tokens by this replica's overlap there."""
        request = event.request
        overlap = self.index.match(request.block_hashes).get(event.instance_id, 0)
        self.active.add(
            request.key,
            event.instance_id,
            request.block_hashes,
            _tail_tokens(request),
            max(request.input_tokens - BLOCK_TOKENS * overlap, 0),
        )

    def observe(self, event: Observation) -> None:
        super().observe(event)
        if isinstance(event, Finished):
            self.active.free((event.request_id, event.attempt))

    def on_first_token(self, event: FirstToken) -> None:
        self.active.prefill_done((event.request_id, event.attempt))

    def on_kv_event(self, event: BlocksChanged) -> None:
        if event.kind == "stored":
            self.index.add(event.instance_id, event.block_hashes)
        else:
            self.index.remove(event.instance_id, event.block_hashes)


def _tail_tokens(request: RequestView) -> int:
    """Prompt tokens after its last full (hashed) block."""
    return max(request.input_tokens - BLOCK_TOKENS * len(request.block_hashes), 0)
