"""``tokenfleet fleet``: the dispatcher process — its engines, its probes, its loop.

``serve`` runs the dispatcher loop (``dispatcher/service.py``) over ``engines`` with the
process's ``/metrics``, ``/health`` and ``/ready`` on ``Settings.http_host`` :
``Settings.dispatcher_web_port`` (``/ready``: the decisions consumer has its partitions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from dispatcher.engines.port import EnginePort
from dispatcher.service import FleetCounts, run_fleet
from infra.kafka.connection import KafkaConnection
from infra.probes import bound_port, start_probes
from infra.settings import Settings

log = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    connection: KafkaConnection,
    engines: EnginePort | str,
    *,
    speed: float = 1.0,
    output_tokens: Mapping[str, int] | None = None,
) -> FleetCounts:
    """Dispatch until cancelled; ``engines`` an engine port, or a fleet spec to emulate."""
    ready = asyncio.Event()
    probes = await start_probes(settings.http_host, settings.dispatcher_web_port, ready.is_set)
    log.warning(
        "dispatcher: kafka %s; http://%s:%d/metrics, /health, /ready",
        connection,
        settings.http_host,
        bound_port(probes),
    )
    try:
        return await run_fleet(
            connection,
            engines,
            speed=speed,
            heartbeat_s=settings.heartbeat_interval_s,
            ready=ready,
            partitions=settings.topic_partitions,
            output_tokens=output_tokens,
        )
    finally:
        await probes.cleanup()
