"""The worker's store: the ClickHouse feedback tables, fed from the log by the store's own
consumer group (``infra/clickhouse/topic_sink.py``), which commits a message's offset once the
store has its row.

The child closes the store after the worker stopped (``worker/child.py``); the sink is stopped
first, with the worker, so its last acknowledged offsets are committed.
"""

from __future__ import annotations

import asyncio

import faust

from infra.clickhouse.feedback import ClickHouseFeedback
from infra.clickhouse.topic_sink import TopicSink, store_group
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings


def feed_from_the_log(
    app: faust.App, settings: Settings, connection: KafkaConnection, store: ClickHouseFeedback
) -> TopicSink:
    """The store's consumer (``TopicSink``), run by a task of ``app`` for as long as the worker
    runs."""
    sink = TopicSink(
        connection,
        store_group(settings.app_id),
        store,
        session_timeout_s=settings.broker_session_timeout_s,
        rebalance_timeout_s=settings.broker_rebalance_timeout_s,
        heartbeat_interval_s=settings.broker_heartbeat_interval_s,
        fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
        max_pending_rows=max(1, settings.feedback_buffer_rows // 2),
        revoke_grace_s=settings.feedback_commit_grace_s,
    )

    @app.task  # type: ignore[untyped-decorator]
    async def storing() -> None:
        """The store's consumer, for as long as the worker runs; stopped (its acknowledged
        offsets committed) before the store is closed."""
        await sink.start()
        try:
            await asyncio.Event().wait()  # until the worker stops and cancels this task
        finally:
            await sink.stop(settings.feedback_commit_grace_s)

    return sink
