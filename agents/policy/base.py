"""Shared parts of routing policies: the per-request loop, own in-flight accounting, pickers."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        raise NotImplementedError

    def decide(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Decision]:
        decisions = []
        for request in requests:
            mask = view.candidates(request)
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
    """

    def __init__(self, max_age_s: float = 30.0) -> None:
        self.requests: dict[str, int] = {}
        self.blocks: dict[str, int] = {}
        self.max_age_s = max_age_s
        self._open: dict[tuple[str, int], tuple[str, int]] = {}
        self._recent: dict[str, deque[tuple[float, int]]] = {}  # instance -> (sent at, input tokens)
        self._recent_totals: dict[str, list[int]] = {}  # instance -> [requests, tokens] in _recent

    def add(self, request: RequestView, instance_id: str, now_s: float) -> None:
        blocks = blocks_for(request.input_tokens)
        self._open[(request.request_id, request.attempt)] = (instance_id, blocks)
        self.requests[instance_id] = self.requests.get(instance_id, 0) + 1
        self.blocks[instance_id] = self.blocks.get(instance_id, 0) + blocks
        self._recent.setdefault(instance_id, deque()).append((now_s, request.input_tokens))
        totals = self._recent_totals.setdefault(instance_id, [0, 0])
        totals[0] += 1
        totals[1] += request.input_tokens

    def complete(self, completion: Completion) -> None:
        sent = self._open.pop((completion.request_id, completion.attempt), None)
        if sent is None:
            return
        instance_id, blocks = sent
        self.requests[instance_id] -= 1
        self.blocks[instance_id] -= blocks

    def per_instance(self, counts: dict[str, int], view: ClusterView) -> IntArray:
        """``counts`` aligned with the rows of ``view``."""
        out = np.zeros(len(view), dtype=np.int64)
        for instance_id, count in counts.items():
            row = view.index_of.get(instance_id)
            if row is not None:
                out[row] = count
        return out

    def since_heartbeat(self, view: ClusterView) -> tuple[IntArray, IntArray]:
        """(requests, input tokens) sent to each row after that row's last heartbeat."""
        requests = np.zeros(len(view), dtype=np.int64)
        tokens = np.zeros(len(view), dtype=np.int64)
        for instance_id, recent in self._recent.items():
            row = view.index_of.get(instance_id)
            cutoff = -np.inf if row is None else float(view.last_heartbeat_s[row])
            if recent:
                cutoff = max(cutoff, recent[-1][0] - self.max_age_s)
            totals = self._recent_totals[instance_id]
            while recent and recent[0][0] <= cutoff:
                _, input_tokens = recent.popleft()
                totals[0] -= 1
                totals[1] -= input_tokens
            if row is not None:
                requests[row], tokens[row] = totals
        return requests, tokens


def pick_min(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the lowest score among ``mask``; ties broken uniformly at random."""
    masked = np.where(mask, scores, np.inf)
    best = np.flatnonzero(masked <= masked.min() + 1e-12)
    return int(best[0] if len(best) == 1 else rng.choice(best))


def pick_max(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the highest score among ``mask``; ties broken uniformly at random."""
    return pick_min(-scores, mask, rng)
