"""The fault suite's pure counting: how keys, decisions, latencies and dead letters become the
figures (their definitions: ``lab.faults``). No broker, no process: unit-tested."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from sim.evaluation.metrics import percentile

Key = tuple[str, int]  # (request_id, attempt)

FIGURES = (
    "published",
    "decided_once",
    "decided_twice",
    "executed_twice",
    "lost",
    "never_answered",
    "dead_lettered",
    "completions_stored",
    "completions_expected",
    "routing_p99_s",
    "recovered_s",
)
"""The figures every scenario reports (``None`` where one does not apply), in table order."""


def tally(keys: Iterable[Key]) -> Counter[Key]:
    """How many times each (request_id, attempt) occurs."""
    return Counter(keys)


def once_and_twice(valid: Iterable[Key], seen: Mapping[Key, int]) -> tuple[int, int]:
    """Of the ``valid`` keys: how many were seen exactly once, how many twice or more."""
    once = twice = 0
    for key in set(valid):
        n = seen.get(key, 0)
        once += n == 1
        twice += n >= 2
    return once, twice


def count_lost(valid: Iterable[Key], decided: Iterable[Key], rejected: Iterable[Key]) -> int:
    """Valid keys with neither a decision nor a reject."""
    answered = set(decided) | set(rejected)
    return sum(1 for key in set(valid) if key not in answered)


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile (NaN skipped); None when there is nothing to rank."""
    return percentile(values, 99.0)


def window_latencies(
    published: Mapping[Key, float], first_decided: Mapping[Key, float], start: float, end: float
) -> list[float]:
    """Decision time - publish time of the keys published in [start, end] that were decided."""
    return [
        first_decided[key] - ts
        for key, ts in published.items()
        if start <= ts <= end and key in first_decided
    ]


def recovered_after(fault_end: float, decision_times: Iterable[float]) -> float | None:
    """Seconds from ``fault_end`` to the first decision strictly after it; None if none came."""
    after = [t for t in decision_times if t > fault_end]
    return min(after) - fault_end if after else None


def missing_digests(bad: Iterable[bytes], dead_letter_digests: Iterable[str]) -> int:
    """Bad messages (by SHA-256 of their bytes) that no dead letter describes."""
    have = set(dead_letter_digests)
    return sum(1 for raw in bad if hashlib.sha256(raw).hexdigest() not in have)


def rounded(value: float | None, digits: int = 3) -> float | None:
    """A figure in seconds as printed and stored: ``None`` for nothing or a non-finite value."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


def longest_pause(times: Iterable[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] with none of ``times`` in it (seconds)."""
    inside = sorted(t for t in times if start <= t <= end)
    edges = [start, *inside, end]
    return max(b - a for a, b in pairwise(edges))


def handover_gaps(
    decisions: Sequence[Any], since: float, until: float, kept_by: str, lost_by: str
) -> tuple[float | None, float | None]:
    """(survivor_gap_s, takeover_gap_s) of a change of deciders at ``since``.

    ``decisions``: ``Decided`` records (``at``, ``worker``, ``partition``). The partitions
    ``kept_by`` decided in the 5 s before ``since`` and still decides after it are the
    survivor's: its gap is the longest pause of decisions on any of them in [since - 2 s,
    until]. The partitions ``lost_by`` decided in those 5 s: the takeover gap is, over those,
    the longest time from ``since`` to the first decision on the partition by another worker
    (``until - since`` if none came). (Only the last 5 s: before that, the partitions may have
    had other owners.)"""
    before = [d for d in decisions if since - 5.0 <= d.at < since]
    after = [d for d in decisions if d.at >= since]
    kept = {d.partition for d in before if d.worker == kept_by} & {
        d.partition for d in after if d.worker == kept_by
    }
    lost = {d.partition for d in before if d.worker == lost_by}
    survivor = None
    if kept:
        survivor = max(
            longest_pause((d.at for d in decisions if d.partition == p), since - 2.0, until) for p in kept
        )
    takeover = None
    if lost:
        takeover = max(
            min((d.at for d in after if d.partition == p and d.worker != lost_by), default=until) - since
            for p in lost
        )
    return survivor, takeover
