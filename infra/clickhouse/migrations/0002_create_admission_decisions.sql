-- SLOMax answers: admit / queue / reject, with the reason.
CREATE TABLE IF NOT EXISTS admission_decisions
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    request_id String,
    attempt UInt16,
    tenant LowCardinality(String),
    model LowCardinality(String),
    slo_class LowCardinality(String),
    action LowCardinality(String),
    reason String,
    policy LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;
