"""The worker's probes: whether it consumes (``WorkerHealth``, read by ``/ready``, the ready
marker and the watchdog) and the pages Faust's web server serves: ``/metrics`` (Prometheus),
``/health`` (live) and ``/ready`` (consuming).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import faust

from infra import metrics
from streams.membership import Membership
from streams.request_lane import RequestLane
from streams.shared_log import SharedLog

HEALTH_MAX_AGE_S = 5.0  # /ready: the readers' last answered fetch at most this old

Health = Callable[[float], tuple[bool, dict[str, Any]]]
"""``health(max_age_s)`` -> (consuming, status): see ``WorkerHealth``."""


class WorkerHealth:
    """Consuming = a settled member of the deciders' group, the shared log read and answered
    within ``max_age_s``, and, if the group gave this worker partitions, the request lane
    reading them with its fetches answered as recently (a worker with no partitions is a ready
    standby: there are more workers than partitions).

    The status beside the verdict: ``consuming``, ``group_settled_for_s`` (how long without an
    assignment, 0 once settled), ``lane_partitions``, ``last_fetch_age_s`` (the lane's) and
    ``highwater`` (each partition read, as last fetched: one that goes down means the broker
    lost its log)."""

    def __init__(self, lane: RequestLane, membership: Membership, shared: SharedLog) -> None:
        self.lane, self.membership, self.shared = lane, membership, shared

    def __call__(self, max_age_s: float = HEALTH_MAX_AGE_S) -> tuple[bool, dict[str, Any]]:
        lane_status = self.lane.status()
        highwater = {**self.shared.highwater(), **lane_status["highwater"]}
        lane_ok = self.lane.healthy(max_age_s) or not self.membership.partitions
        settled_for = self.membership.settled_for()
        consuming = settled_for == 0.0 and self.shared.fresh(max_age_s) and lane_ok
        return consuming, {
            "consuming": consuming,
            "group_settled_for_s": round(settled_for, 3),
            "lane_partitions": lane_status["partitions"],
            "last_fetch_age_s": lane_status["last_fetch_age_s"],
            "highwater": highwater,
        }


def serve_probes(app: faust.App, health: Health) -> None:
    """Add ``/metrics``, ``/health`` and ``/ready`` to ``app``'s web server."""

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(metrics.render(), content_type="text/plain; version=0.0.4")

    @app.page("/health")
    async def health_page(web: Any, request: Any) -> Any:
        """Live: the worker's event loop answers."""
        return web.json({"live": True})

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        """Serving: the request lane reads partitions and the broker answers its fetches."""
        consuming, body = health(HEALTH_MAX_AGE_S)
        body.pop("highwater")
        return web.json(body, status=200 if consuming else 503)
