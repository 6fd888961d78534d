"""Shared parts of routing policies: the per-request loop, own in-flight accounting, pickers."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.policy.common.slots import SlotRows
from agents.policy.types import BLOCK_TOKENS, ClusterView, Completion, Decision, KvEvent, RequestView

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def blocks_for(tokens: int) -> int:
    """Number of ``BLOCK_TOKENS`` blocks needed to hold ``tokens`` tokens (ceil)."""
    return -(-tokens // BLOCK_TOKENS)


@dataclass(frozen=True, slots=True)
class Pick:
    """What a routing policy chose for one request: a view row, why, and its prediction."""

    instance: int
    reason: str
    predicted_ttft_s: float | None = None


class RoutingPolicy:
    """Base for policies that route every request to one instance (no admission control).

    Subclasses implement ``pick``; this class turns picks into decisions, rejects requests no
    instance can serve, and keeps the router's own in-flight accounting (``in_flight``).
    """

    name = "routing"
    wants_kv_events = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.in_flight = InFlight()
        self._candidates_cache: tuple[ClusterView, str, BoolArray] | None = None

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        raise NotImplementedError

    def decide(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Decision]:
        decisions = []
        for request in requests:
            mask = self._candidates(request, view)
            if not mask.any():
                decisions.append(
                    Decision(
                        request.request_id,
                        request.attempt,
                        "reject",
                        reason="no ready instance serves the model",
                    )
                )
                continue
            choice = self.pick(request, view, mask, now_s)
            self.in_flight.add(request, view.instance_ids[choice.instance], now_s)
            self.on_routed(request, view, choice.instance)
            decisions.append(
                Decision(
                    request.request_id,
                    request.attempt,
                    "route",
                    instance=choice.instance,
                    reason=choice.reason,
                    predicted_ttft_s=choice.predicted_ttft_s,
                )
            )
        return decisions

    def _candidates(self, request: RequestView, view: ClusterView) -> BoolArray:
        """``view.candidates(request)``, computed once per snapshot and model (string compares
        over the whole pool are among the costliest steps of a decision on a large pool)."""
        cached = self._candidates_cache
        if cached is not None and cached[0] is view and cached[1] == request.model:
            return cached[2]
        mask = view.candidates(request)
        self._candidates_cache = (view, request.model, mask)
        return mask

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        """Hook after a request was sent to ``row`` (e.g. remember its prefix there)."""

    def observe(self, event: KvEvent | Completion) -> None:
        if isinstance(event, Completion):
            self.in_flight.complete(event)
        else:
            self.on_kv_event(event)

    def on_kv_event(self, event: KvEvent) -> None:
        """Hook for KV events (only delivered when ``wants_kv_events``)."""


class InFlight:
    """Requests this router sent and has not yet seen complete, per instance.

    A router that proxies every request knows these counts exactly; heartbeats do not. It also
    remembers, per instance, what it sent after that instance's last heartbeat, so
    ``since_heartbeat`` can add to a stale snapshot exactly the work the snapshot cannot contain
    yet. Each send is forgotten once a heartbeat from its instance postdates it (or after
    ``max_age_s``, for an instance that stopped reporting): cost is amortised O(1) per send.

    ``requests`` / ``blocks`` are plain dicts (instance id -> count); per-slot numpy mirrors of
    them and of the since-heartbeat totals make ``per_instance`` and ``since_heartbeat`` a few
    vectorised operations per call, plus Python work only for instances whose cut-off moved
    (a new heartbeat) and that have sends to forget.
    """

    def __init__(self, max_age_s: float = 30.0) -> None:
        self.requests: dict[str, int] = {}
        self.blocks: dict[str, int] = {}
        self.max_age_s = max_age_s
        self._open: dict[tuple[str, int], tuple[str, int]] = {}
        self._slot_of: dict[str, int] = {}
        self._slot_ids: list[str] = []
        self._recent: list[deque[tuple[float, int]]] = []  # slot -> (sent at, input tokens)
        size = 16
        self._requests = np.zeros(size, dtype=np.int64)  # mirror of ``requests``
        self._blocks = np.zeros(size, dtype=np.int64)  # mirror of ``blocks``
        self._recent_requests = np.zeros(size, dtype=np.int64)  # totals of ``_recent``
        self._recent_tokens = np.zeros(size, dtype=np.int64)
        self._last_sent = np.full(size, -np.inf)  # newest send per slot
        self._applied = np.full(size, -np.inf)  # cut-off ``_recent`` was last trimmed to
        self._slot_rows = SlotRows()

    def add(self, request: RequestView, instance_id: str, now_s: float) -> None:
        blocks = blocks_for(request.input_tokens)
        self._open[(request.request_id, request.attempt)] = (instance_id, blocks)
        self.requests[instance_id] = self.requests.get(instance_id, 0) + 1
        self.blocks[instance_id] = self.blocks.get(instance_id, 0) + blocks
        slot = self._slot(instance_id)
        self._requests[slot] += 1
        self._blocks[slot] += blocks
        self._last_sent[slot] = max(self._last_sent[slot], now_s)
        if now_s <= self._applied[slot]:
            return  # already older than the instance's last heartbeat: nothing to add
        self._recent[slot].append((now_s, request.input_tokens))
        self._recent_requests[slot] += 1
        self._recent_tokens[slot] += request.input_tokens

    def complete(self, completion: Completion) -> None:
        sent = self._open.pop((completion.request_id, completion.attempt), None)
        if sent is None:
            return
        instance_id, blocks = sent
        self.requests[instance_id] -= 1
        self.blocks[instance_id] -= blocks
        slot = self._slot_of[instance_id]
        self._requests[slot] -= 1
        self._blocks[slot] -= blocks

    def per_instance(self, counts: dict[str, int], view: ClusterView) -> IntArray:
        """``counts`` aligned with the rows of ``view``."""
        out = np.zeros(len(view), dtype=np.int64)
        mirror = (
            self._requests if counts is self.requests else self._blocks if counts is self.blocks else None
        )
        if mirror is not None:
            slots, rows = self._rows(view)
            out[rows] = mirror[slots]
            return out
        for instance_id, count in counts.items():
            row = view.index_of.get(instance_id)
            if row is not None:
                out[row] = count
        return out

    def since_heartbeat(self, view: ClusterView) -> tuple[IntArray, IntArray]:
        """(requests, input tokens) sent to each row after that row's last heartbeat."""
        requests = np.zeros(len(view), dtype=np.int64)
        tokens = np.zeros(len(view), dtype=np.int64)
        slots, rows = self._rows(view)
        if len(slots) == 0:
            return requests, tokens
        cutoff = np.maximum(view.last_heartbeat_s[rows], self._last_sent[slots] - self.max_age_s)
        moved = (cutoff > self._applied[slots]) & (self._recent_requests[slots] > 0)
        if moved.any():
            for slot, cut in zip(slots[moved].tolist(), cutoff[moved].tolist(), strict=True):
                recent = self._recent[slot]
                gone_requests = gone_tokens = 0
                while recent and recent[0][0] <= cut:
                    gone_tokens += recent.popleft()[1]
                    gone_requests += 1
                self._recent_requests[slot] -= gone_requests
                self._recent_tokens[slot] -= gone_tokens
        self._applied[slots] = np.maximum(self._applied[slots], cutoff)
        requests[rows] = self._recent_requests[slots]
        tokens[rows] = self._recent_tokens[slots]
        return requests, tokens

    def _slot(self, instance_id: str) -> int:
        slot = self._slot_of.get(instance_id)
        if slot is None:
            slot = self._slot_of[instance_id] = len(self._slot_ids)
            self._slot_ids.append(instance_id)
            self._recent.append(deque())
            if slot >= len(self._requests):
                grow = len(self._requests)
                self._requests = np.concatenate([self._requests, np.zeros(grow, dtype=np.int64)])
                self._blocks = np.concatenate([self._blocks, np.zeros(grow, dtype=np.int64)])
                self._recent_requests = np.concatenate(
                    [self._recent_requests, np.zeros(grow, dtype=np.int64)]
                )
                self._recent_tokens = np.concatenate([self._recent_tokens, np.zeros(grow, dtype=np.int64)])
                self._last_sent = np.concatenate([self._last_sent, np.full(grow, -np.inf)])
                self._applied = np.concatenate([self._applied, np.full(grow, -np.inf)])
        return slot

    def _rows(self, view: ClusterView) -> tuple[IntArray, IntArray]:
        """(slots, rows) of the instances both sent to and present in ``view``."""
        return self._slot_rows.of(view.index_of, self._slot_ids)


def pick_min(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the lowest score among ``mask``; ties broken uniformly at random."""
    masked = np.where(mask, scores, np.inf)
    best = np.flatnonzero(masked <= masked.min() + 1e-12)
    return int(best[0] if len(best) == 1 else rng.choice(best))


def pick_max(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the highest score among ``mask``; ties broken uniformly at random."""
    return pick_min(-scores, mask, rng)
