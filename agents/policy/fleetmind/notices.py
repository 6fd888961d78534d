"""What FleetMind tells operators: DC state changes, reservation moves, replica advice.

Plain data, drained by the driver (``Scheduler.notices``): the simulator reports them in its
JSON, the streaming worker publishes them on ``tf.fleet-events`` and stores them in ClickHouse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NoticeKind = Literal["dc_down", "dc_recovering", "dc_up", "reservation_moved", "replica_advice"]


@dataclass(frozen=True, slots=True)
class FleetNotice:
    """``kind`` happened to ``dc`` for ``model`` at ``model_version`` at ``time_s``.

    ``replica_advice``: ``delta`` instances (+1 add, -1 remove) of the model version in ``dc``,
    which makes ``replicas`` instances of it there (what an autoscaler should converge to);
    ``reservation_moved``: ``tenant``'s reservation now booked in ``dc`` ("" = nowhere).
    ``detail`` says why, in words, with the figures it was based on.
    """

    kind: NoticeKind
    dc: str
    model: str
    model_version: str
    time_s: float
    detail: str
    delta: int = 0
    tenant: str = ""
    replicas: int | None = None
