"""The scheduler's queue pools: the requests it holds, by named pool, first in first out.

A request is held when admission says ``queue`` (in the pool it names), when no allowed DC has
a ready instance of its model (``NO_CAPACITY_POOL``), or while it waits for the decision log
(``DEFERRED_POOL``, several deciders: ``agents/policy/lanes.py``). It leaves its pool by being
placed, rejected, withdrawn (its client gave up) or expired.

Holding is bounded (``HoldLimits``): a pool that already holds ``max_per_pool`` requests
rejects the next one (reason ``queue_full``); a request held longer than ``timeout_s`` is
rejected (reason ``expired``) by ``expire``. No limits by default (the simulator's clients give
up by themselves); the service sets them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from agents.policy.types import Outcome, RequestView

NO_CAPACITY_POOL = "no_capacity"
DEFERRED_POOL = "deferred"


@dataclass(frozen=True, slots=True)
class HoldLimits:
    """How many requests one queue pool may hold, and for how long (seconds); None = no limit."""

    max_per_pool: int | None = None
    timeout_s: float | None = None


@dataclass(slots=True)
class _Held:
    request: RequestView
    pool: str
    reason: str
    since_s: float
    due_s: float | None = None  # not offered before then (a deferred arrival)


class QueuePools:
    """The held requests, keyed by ``RequestView.key``; insertion order is FIFO across pools.

    A held request may carry a due time (``hold(..., due_s=T)``): it is not offered before ``T``
    (``due`` hands it over then, and it is held as any other from that moment)."""

    def __init__(self, limits: HoldLimits | None = None) -> None:
        self.limits = limits or HoldLimits()
        self._held: dict[tuple[str, int], _Held] = {}
        self._sizes: dict[str, int] = {}
        self._deferred = 0  # entries with a due time

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._held

    def sizes(self) -> dict[str, int]:
        """Requests held, per non-empty pool."""
        return {pool: n for pool, n in self._sizes.items() if n}

    def hold(
        self, request: RequestView, pool: str, reason: str, now_s: float, due_s: float | None = None
    ) -> list[Outcome]:
        """Keep ``request`` in ``pool``: a ``queue`` outcome the first time only (a request held
        again keeps its place and its age); a reject when the pool is full."""
        held = self._held.get(request.key)
        if held is not None:
            self._sizes[held.pool] -= 1
            self._sizes[pool] = self._sizes.get(pool, 0) + 1
            held.pool, held.reason = pool, reason
            return []
        limit = self.limits.max_per_pool
        if limit is not None and self._sizes.get(pool, 0) >= limit:
            return [rejected(request, f"queue_full: {pool} holds {limit} requests ({reason})")]
        self._held[request.key] = _Held(request, pool, reason, now_s, due_s)
        self._sizes[pool] = self._sizes.get(pool, 0) + 1
        self._deferred += due_s is not None
        return [Outcome(request, "queue", reason, reason, pool=pool)]

    def release(self, key: tuple[str, int]) -> bool:
        """Take ``key`` out of its pool; False if it was not held."""
        entry = self._held.pop(key, None)
        if entry is None:
            return False
        self._sizes[entry.pool] -= 1
        self._deferred -= entry.due_s is not None
        return True

    def expire(self, now_s: float) -> list[Outcome]:
        """Release and reject (reason ``expired``) every request held over ``timeout_s``."""
        timeout = self.limits.timeout_s
        if timeout is None or not self._held:
            return []
        gone = [h for h in self._held.values() if now_s - h.since_s > timeout]
        for entry in gone:
            self.release(entry.request.key)
        return [
            rejected(h.request, f"expired: held in {h.pool} over {timeout:g} s ({h.reason})") for h in gone
        ]

    def waiting(self) -> Iterator[RequestView]:
        """The held requests without a due time, oldest first."""
        return (h.request for h in self._held.values() if h.due_s is None)

    def has_waiting(self) -> bool:
        """Whether a request is held without a due time."""
        return len(self._held) > self._deferred

    def due(self, now_s: float) -> list[RequestView]:
        """The requests due by ``now_s``, oldest first; from now on held as any other."""
        if not self._deferred:
            return []
        due = []
        for entry in self._held.values():
            if entry.due_s is not None and entry.due_s <= now_s:
                entry.due_s = None
                self._deferred -= 1
                due.append(entry.request)
        return due

    def next_due_s(self) -> float | None:
        """The earliest due time (None: no request has one)."""
        if not self._deferred:  # no walk over the held requests (thousands under overload)
            return None
        return min(h.due_s for h in self._held.values() if h.due_s is not None)


def rejected(request: RequestView, reason: str) -> Outcome:
    """A reject decided by the scheduler itself; ``reason`` starts with its code."""
    return Outcome(request, "reject", reason, reason)
