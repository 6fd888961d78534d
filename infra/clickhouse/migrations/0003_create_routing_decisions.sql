-- Where each request ran and the prediction the choice was based on (for prediction error).
CREATE TABLE IF NOT EXISTS routing_decisions
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    request_id String,
    attempt UInt16,
    tenant LowCardinality(String),
    model LowCardinality(String),
    slo_class LowCardinality(String),
    dc LowCardinality(String),
    instance_id LowCardinality(String),
    policy LowCardinality(String),
    reason String,
    predicted_ttft_s Nullable(Float64),
    decision_latency_s Float64,
    input_tokens UInt32,
    output_budget UInt32
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;
