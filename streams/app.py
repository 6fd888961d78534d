"""The Faust app factory and its topic / table bindings.

All topics carry raw bytes: decoding is ours (``schemas.codec``), so an undecodable message
becomes a dead letter with its reason instead of an exception inside Faust.

Settings for the embedded broker: Tansu holds a consumer-group join for half the client's
rebalance timeout, so Faust's 60 s default would stall every start by 30 s. Rebalance and session
timeouts of 6 s and a 1 s heartbeat make a join take about 3 s (``infra.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust

from infra.settings import Settings
from schemas import topics
from streams.transport import TokenFleetApp


@dataclass(frozen=True, slots=True)
class Channels:
    """The app's topics and tables. ``instance_state``: model pool -> {instance id: Heartbeat dict}."""

    requests: Any
    heartbeats: Any
    kv_events: Any
    completions: Any
    admission: Any
    decisions: Any
    batch_jobs: Any
    dlq: Any
    instance_state: Any


def create_app(settings: Settings, bootstrap: str, web_port: int | None = None) -> tuple[faust.App, Channels]:
    app = TokenFleetApp(
        settings.app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=1,
        broker_rebalance_timeout=settings.broker_rebalance_timeout_s,
        broker_session_timeout=settings.broker_session_timeout_s,
        broker_heartbeat_interval=settings.broker_heartbeat_interval_s,
        consumer_auto_offset_reset="earliest",
        producer_linger=0.002,  # a few ms of batching: far fewer, larger produce requests
        web_enabled=True,
        web_port=settings.worker_web_port if web_port is None else web_port,
        web_bind="127.0.0.1",
        datadir=str(settings.data_dir / "faust"),
        fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
    )

    def raw_topic(spec: topics.TopicSpec) -> Any:
        return app.topic(
            spec.name,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.topic_partitions,
        )

    channels = Channels(
        requests=raw_topic(topics.REQUESTS),
        heartbeats=raw_topic(topics.HEARTBEATS),
        kv_events=raw_topic(topics.KV_EVENTS),
        completions=raw_topic(topics.COMPLETIONS),
        admission=raw_topic(topics.ADMISSION),
        decisions=raw_topic(topics.DECISIONS),
        batch_jobs=raw_topic(topics.BATCH_JOBS),
        dlq=raw_topic(topics.DLQ),
        instance_state=app.Table(
            "instance-state",
            default=dict,
            partitions=settings.topic_partitions,
        ),
    )
    return app, channels
