-- One row per ended attempt. met_slo is judged by the sink at insert time against the
-- slo_classes in force (1 only for status 'ok' meeting every threshold of its class).
CREATE TABLE IF NOT EXISTS completions
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    request_id String,
    attempt UInt16,
    instance_id LowCardinality(String),
    model LowCardinality(String),
    tenant LowCardinality(String),
    slo_class LowCardinality(String),
    status LowCardinality(String),
    arrival_ts DateTime64(3, 'UTC'),
    ttft_s Nullable(Float64),
    tpot_s Nullable(Float64),
    e2e_s Nullable(Float64),
    input_tokens UInt32,
    cached_tokens UInt32,
    output_tokens UInt32,
    deadline_ts Nullable(DateTime64(3, 'UTC')),
    met_slo UInt8
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;
