"""Hot keys spread over the deciders: what a publisher does before it sends a request.

A pool's requests reach its deciders by their affinity key (``InferenceRequest.affinity_key``:
the pool and the hash of the prompt's first blocks), so requests sharing a prefix meet one
decider, the one that saw where the previous ones went a few milliseconds ago. A prefix most of
the traffic shares (one long system prompt, a batch job's instructions) then brings all of it
to one decider, however many there are. ``HotKeys`` counts each key's rate at the
publisher and, once it is hot, spreads that key's requests over ``spread`` sub-keys:

- rate(key) is an exponentially decayed count of the key's requests, in requests per second
  over ``window_s``: r ← r·exp(-Δt / window_s) + 1 / window_s at each request;
- hot ⟺ r > ``hot_rate_per_s``: the request gets ``affinity = "<prefix>~k"`` with
  k = CRC-32(request id) mod ``spread`` (a request keeps its sub-key on a retry or a resend:
  the same partition, so the same decider, hears it again); cold keys keep the default.

Spreading costs little: a prefix that hot is cached on every instance within seconds, and every
decider sees the others' placements and the engines' KV events anyway; what is lost is only
that its requests no longer meet on one decider within the same few milliseconds. Each
publisher counts its own traffic (a gateway replica sees its share), so the threshold is per
publisher. At most ``max_keys`` keys are counted (the least recently seen are forgotten).
``agents.affinity.HotPrefixes`` applies it to a request; the simulator's deciders use it as is.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict

HOT_PREFIX_RATE_PER_S = 500.0
"""Requests per second of one affinity key, at one publisher, above which it is spread: an
eighth of what one decider routes with TokenPilot (about 4 000 per second, ``make bench-stream``)."""
HOT_PREFIX_SPREAD = 64
"""Sub-keys a hot key is spread over: many more than a pool has deciders, so that hashing them
onto partitions, and the partitions onto deciders, leaves each decider a near-equal share."""
SPREAD_MARK = "~"
"""Separates a hot key from its sub-key number in ``InferenceRequest.affinity``."""


class HotKeys:
    """Per affinity key, its decayed rate; the affinity a request of it should carry."""

    def __init__(
        self,
        hot_rate_per_s: float = HOT_PREFIX_RATE_PER_S,
        spread: int = HOT_PREFIX_SPREAD,
        window_s: float = 1.0,
        max_keys: int = 10_000,
    ) -> None:
        if hot_rate_per_s <= 0 or spread < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("hot_rate_per_s and window_s must be > 0, spread and max_keys >= 1")
        self.hot_rate_per_s, self.spread = hot_rate_per_s, spread
        self.window_s, self.max_keys = window_s, max_keys
        self._rates: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (rate, as of)

    def affinity(self, key: str, request_id: str, now_s: float) -> str:
        """Count one request of ``key`` at ``now_s``; ``""`` (keep the default key) unless the
        key is hot, then ``"<key's prefix part>~k"`` (module docstring)."""
        rate = self._count(key, now_s)
        if rate <= self.hot_rate_per_s or self.spread == 1:
            return ""
        prefix = key.rsplit("/", 1)[-1]  # (the key is "<pool>/<prefix>": the pool is added again)
        return f"{prefix}{SPREAD_MARK}{zlib.crc32(request_id.encode()) % self.spread}"

    def rate(self, key: str, now_s: float) -> float:
        """``key``'s rate at ``now_s`` (requests per second), without counting a request."""
        rate, as_of = self._rates.get(key, (0.0, now_s))
        return rate * math.exp(-max(now_s - as_of, 0.0) / self.window_s)

    def _count(self, key: str, now_s: float) -> float:
        rate = self.rate(key, now_s) + 1.0 / self.window_s
        self._rates[key] = (rate, now_s)
        self._rates.move_to_end(key)
        if len(self._rates) > self.max_keys:
            self._rates.popitem(last=False)
        return rate
