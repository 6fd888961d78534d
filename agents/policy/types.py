"""The policy seam: what a policy reads, what it returns, what it may observe.

Everything here is plain data. The simulator (`sim/`) and the streaming agents build the same
objects, so a policy cannot tell which of them is driving it.

What a policy may see is exactly what a real router sees: the request as the client sent it
(never its true output length), heartbeat snapshots of the instances (stale by up to one
heartbeat interval), its own past decisions, completion events as responses stream back through
the router, and, if it sets ``wants_kv_events``, the instances' KV-cache events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

BLOCK_TOKENS = 512
"""KV-cache block size in tokens; prompt block hashes are computed per full block of this size."""

Action = Literal["route", "queue", "reject"]
CompletionStatus = Literal["ok", "timeout", "aborted", "error", "rejected"]


@dataclass(frozen=True, slots=True)
class RequestView:
    """One attempt of a request, as the router receives it.

    ``block_hashes`` are chained hashes of the prompt's full 512-token blocks: equal hash at
    position i means the whole prefix up to block i is equal. ``output_budget`` is the client's
    ``max_tokens`` cap, not the (unknowable) true output length.
    """

    request_id: str
    attempt: int
    tenant: str
    model: str
    slo_class: str
    input_tokens: int
    output_budget: int
    block_hashes: tuple[int, ...]
    arrival_s: float
    deadline_s: float | None = None
    task_type: str = "chat"


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Struct-of-arrays snapshot of the instances, one row per instance, built from heartbeats.

    Counts are as of each instance's last heartbeat (``last_heartbeat_s``); requests routed since
    then are not in them, which is why policies keep their own in-flight accounting.
    ``kv_used`` / ``kv_total`` are in blocks of ``BLOCK_TOKENS``. ``profile`` names the engine
    profile (hardware + model), so heterogeneous pools can be compared by predicted latency.
    """

    instance_ids: tuple[str, ...]
    dc: npt.NDArray[np.str_]
    model: npt.NDArray[np.str_]
    version: npt.NDArray[np.str_]
    profile: npt.NDArray[np.str_]
    ready: npt.NDArray[np.bool_]
    waiting: npt.NDArray[np.int64]
    running: npt.NDArray[np.int64]
    tokens_in_flight: npt.NDArray[np.int64]
    kv_used: npt.NDArray[np.int64]
    kv_total: npt.NDArray[np.int64]
    last_heartbeat_s: npt.NDArray[np.float64]
    index_of: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index_of", {iid: i for i, iid in enumerate(self.instance_ids)})

    def __len__(self) -> int:
        return len(self.instance_ids)

    def candidates(self, request: RequestView) -> npt.NDArray[np.bool_]:
        """Filter: instances that are ready and serve the request's model."""
        mask: npt.NDArray[np.bool_] = self.ready & (self.model == request.model)
        return mask


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for one request attempt.

    ``instance`` is an index into the ``ClusterView`` the decision was made on (``-1`` unless
    ``action == "route"``). ``predicted_ttft_s`` is the prediction the decision was based on, if
    the policy makes one, so feedback can measure prediction error.
    """

    request_id: str
    attempt: int
    action: Action
    instance: int = -1
    reason: str = ""
    predicted_ttft_s: float | None = None


@dataclass(frozen=True, slots=True)
class KvEvent:
    """Blocks stored in or removed from one instance's prefix cache."""

    instance_id: str
    kind: Literal["stored", "removed"]
    block_hashes: tuple[int, ...]
    time_s: float


@dataclass(frozen=True, slots=True)
class Completion:
    """The end of one request attempt, as the router sees the response stream close."""

    request_id: str
    attempt: int
    instance_id: str
    status: CompletionStatus
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    time_s: float
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """A routing / admission policy.

    Contract:
    - ``decide`` is called with a batch of request attempts, the latest snapshot and the current
      time; it returns exactly one ``Decision`` per request, in the same order. It may mutate the
      policy's own state (own in-flight accounting) but never the view.
    - ``observe`` is called, in time order, with every completion and, when ``wants_kv_events``
      is true, every KV event. It must be cheap and must not raise on unknown instances.
    - A policy never reads the true output length: it is not in any of its inputs.
    """

    name: str
    wants_kv_events: bool

    def decide(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Decision]: ...

    def observe(self, event: KvEvent | Completion) -> None: ...
