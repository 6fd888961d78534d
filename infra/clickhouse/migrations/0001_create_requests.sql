-- Requests as they reached the scheduler. ReplacingMergeTree on event_id: a redelivered event
-- collapses into one row (read with FINAL or GROUP BY event_id).
CREATE TABLE IF NOT EXISTS requests
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    request_id String,
    attempt UInt16,
    tenant LowCardinality(String),
    model LowCardinality(String),
    task_type LowCardinality(String),
    slo_class LowCardinality(String) COMMENT 'empty when the client declared none',
    input_tokens UInt32,
    output_budget UInt32,
    prompt_blocks UInt32,
    deadline_ts Nullable(DateTime64(3, 'UTC')),
    allowed_regions Array(LowCardinality(String)),
    true_output_tokens Nullable(UInt32) COMMENT 'emulation only'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;
