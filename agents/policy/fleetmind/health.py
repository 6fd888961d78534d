"""Fallback and gradual return: each DC's serving state for one model version.

    up ──(no ready, fresh instance)──> down ──(ready again)──> recovering ──(recovery_s)──> up
                                         ^                          │
                                         └──(none ready again)──────┘

While ``recovering`` for t seconds, a DC takes a share w = t / recovery_s of the requests that
would go there: request r is let in when u(r) < w, u a hash of the request id into [0, 1), so
the same request gets the same answer on every offer and traffic returns gradually, not in one
step onto cold caches. The hysteresis: one missing heartbeat round does not flap a DC (it is
down only after ``stale_after_s``), and a DC that just came back gets traffic only as its
ramp allows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.notices import FleetNotice, NoticeKind

DcState = Literal["up", "down", "recovering"]
_NOTICE_OF: dict[DcState, NoticeKind] = {"up": "dc_up", "down": "dc_down", "recovering": "dc_recovering"}


@dataclass(slots=True)
class _Dc:
    state: DcState
    since_s: float
    served: bool  # was ever up: a DC that never served has no traffic to give back gradually


class DcHealth:
    """Serving state per (DC, model, version); ``update`` returns the transitions as notices."""

    def __init__(self, recovery_s: float) -> None:
        self.recovery_s = recovery_s
        self._dcs: dict[tuple[str, str, str], _Dc] = {}

    def update(
        self, model: str, version: str, capacities: dict[str, DcCapacity], now_s: float
    ) -> list[FleetNotice]:
        notices = []
        for dc, cap in capacities.items():
            key = (dc, model, version)
            entry = self._dcs.get(key)
            if entry is None:
                self._dcs[key] = _Dc("up" if cap.ready else "down", now_s, cap.ready > 0)
                continue
            new: DcState = self._next(entry, cap.ready > 0, now_s)
            if new != entry.state:
                entry.state, entry.since_s = new, now_s
                entry.served = entry.served or new == "up"
                notices.append(
                    FleetNotice(
                        _NOTICE_OF[new], dc, model, version, now_s,
                        f"{cap.ready} of {cap.deployed} instances ready with a fresh heartbeat",
                    )
                )  # fmt: skip
        return notices

    def _next(self, entry: _Dc, serving: bool, now_s: float) -> DcState:
        if not serving:
            return "down"
        if entry.state == "down":
            return "recovering" if entry.served else "up"
        if entry.state == "recovering" and now_s - entry.since_s >= self.recovery_s:
            return "up"
        return entry.state

    def state(self, dc: str, model: str, version: str) -> DcState:
        entry = self._dcs.get((dc, model, version))
        return "up" if entry is None else entry.state

    def share(self, dc: str, model: str, version: str, now_s: float) -> float:
        """The share of requests the DC takes now: 1 up, 0 down, the ramp while recovering."""
        entry = self._dcs.get((dc, model, version))
        if entry is None or entry.state == "up":
            return 1.0
        if entry.state == "down":
            return 0.0
        return min(1.0, (now_s - entry.since_s) / self.recovery_s) if self.recovery_s > 0 else 1.0

    def lets_in(self, dc: str, model: str, version: str, request_id: str, now_s: float) -> bool:
        share = self.share(dc, model, version, now_s)
        return share >= 1.0 or unit_hash(request_id) < share


def unit_hash(text: str) -> float:
    """A stable number in [0, 1) for ``text`` (the same on every run and every process)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
