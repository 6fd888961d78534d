"""TokenPilot's order for a burst of arrivals (``TokenPilot.order``; the ``Scheduler`` places
and reports the burst in that order, ``OrdersBatch``).

The order a batch is decided in (``order``), while the KV cache of the batch's candidate
instances is less than ``largest_first_below_kv`` used (0.6): first the requests with a home (at
least half the prompt cached on a candidate), then the others, each **largest prompt first**;
once the cache is fuller, as it came.

Why. Decided in arrival order, a burst's short prompt often goes first to an idle instance and a
long prompt of the same instant then lands there too (an instance with one fresh decode has the
fewest decodes to harm): its prefill chunks ride in every step of the short answer's decode, and
an answer of a few tokens misses its TPOT. Decided largest first, the long prompt's queue is
known when the short ones are placed, and they go around it. A request with a home goes first
because its place is where its cache is: placed after a long prompt, it would leave its cache to
avoid the long prefill, and the median TTFT would suffer. Once the cache fills, the order goes
back to arrival: vLLM preempts the request it scheduled last when KV runs out, and a short
prompt decided after a long one on the same instance would be that request (largest first at
any KV use costs goodput past capacity). Figures: docs/results/scoreboard.md, "Where the
interactive misses on Mooncake as shipped were".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.policy.common.numeric import BoolArray
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.types import BLOCK_TOKENS, ClusterView, RequestView

HOME_SHARE = 0.5
"""A request with at least this share of its prompt cached on a candidate has a home there: it
is decided before the batch's other requests."""


def cache_has_room(view: ClusterView, below_kv: float, rows: BoolArray | None = None) -> bool:
    """Whether the KV cache of ``rows`` (None: every instance) is less than ``below_kv`` used."""
    total_kv, used_kv = (
        (view.kv_total, view.kv_used) if rows is None else (view.kv_total[rows], view.kv_used[rows])
    )
    total = float(total_kv.sum())
    return total > 0 and float(used_kv.sum()) < below_kv * total


def decision_order(
    requests: Sequence[RequestView],
    candidates: Sequence[BoolArray],
    view: ClusterView,
    index: PrefixIndex,
    below_kv: float,
) -> list[int]:
    """The batch's indices in the order it is decided (module docstring): while the
    candidates' KV cache is less than ``below_kv`` used, first the requests with a home (at
    least ``HOME_SHARE`` of the prompt cached on one of its candidates, by the router's prefix
    ``index``), then the others, each group largest prompt first (ties as they came);
    otherwise as they came."""
    arrival = list(range(len(requests)))
    masks = np.asarray(candidates)
    if not cache_has_room(view, below_kv, np.logical_or.reduce(masks, axis=0)):
        return arrival
    index.size_like(view)

    def key(i: int) -> tuple[bool, int]:
        request = requests[i]
        homed = False
        if request.block_hashes:
            blocks = int(index.match_array(request.block_hashes, view)[masks[i]].max())
            homed = blocks * BLOCK_TOKENS >= HOME_SHARE * request.input_tokens
        return (not homed, -request.input_tokens)

    return sorted(arrival, key=key)
