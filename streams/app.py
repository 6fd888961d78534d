"""The Faust app factory and its topics and tables. Takes plain arguments (no settings object).

All topics carry raw bytes: decoding is ours (``schemas.codec``), so an undecodable message
becomes a dead letter with its reason instead of an exception inside Faust.

For the embedded broker: Tansu holds a consumer-group join for half the client's rebalance
timeout, so Faust's 60 s default would stall every start by 30 s; the worker passes 6 s
rebalance and session timeouts and a 1 s heartbeat (a join takes about 3 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust

from schemas import topics
from streams.connection import BrokerConnection
from streams.transport import TokenFleetApp


@dataclass(frozen=True, slots=True)
class Channels:
    """The app's topics."""

    requests: Any
    heartbeats: Any
    kv_events: Any
    first_tokens: Any
    completions: Any
    admission: Any
    decisions: Any
    batch_jobs: Any
    dlq: Any


def create_app(
    app_id: str,
    connection: BrokerConnection,
    *,
    partitions: int,
    data_dir: Path,
    web_port: int,
    web_host: str = "127.0.0.1",
    rebalance_timeout_s: float,
    session_timeout_s: float,
    heartbeat_interval_s: float,
    fetch_max_wait_ms: int,
) -> tuple[faust.App, Channels]:
    app = TokenFleetApp(
        app_id,
        broker=connection.faust_broker(),
        broker_credentials=connection.faust_credentials(),
        store="memory://",
        topic_partitions=partitions,
        topic_replication_factor=1,
        broker_rebalance_timeout=rebalance_timeout_s,
        broker_session_timeout=session_timeout_s,
        broker_heartbeat_interval=heartbeat_interval_s,
        consumer_auto_offset_reset="earliest",
        producer_linger=0.002,  # a few ms of batching: far fewer, larger produce requests
        web_enabled=True,
        web_port=web_port,
        web_bind=web_host,
        datadir=str(data_dir / "faust"),
        fetch_max_wait_ms=fetch_max_wait_ms,
    )

    def raw_topic(spec: topics.TopicSpec) -> Any:
        return app.topic(spec.name, key_serializer="raw", value_serializer="raw", partitions=partitions)

    channels = Channels(
        requests=raw_topic(topics.REQUESTS),
        heartbeats=raw_topic(topics.HEARTBEATS),
        kv_events=raw_topic(topics.KV_EVENTS),
        first_tokens=raw_topic(topics.FIRST_TOKENS),
        completions=raw_topic(topics.COMPLETIONS),
        admission=raw_topic(topics.ADMISSION),
        decisions=raw_topic(topics.DECISIONS),
        batch_jobs=raw_topic(topics.BATCH_JOBS),
        dlq=raw_topic(topics.DLQ),
    )
    return app, channels
