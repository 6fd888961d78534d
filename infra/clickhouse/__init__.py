"""The ClickHouse feedback store: client, migrations, the sink that writes events, the summary."""

from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from infra.clickhouse.sink import FeedbackSink, sync_slo_classes
from infra.clickhouse.summary import summary

__all__ = ["FeedbackSink", "connect", "migrate", "summary", "sync_slo_classes"]
