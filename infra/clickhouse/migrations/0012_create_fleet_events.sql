-- What FleetMind told operators: DC state changes (dc_down, dc_recovering, dc_up), reservation
-- moves and replica advice, one row per event (a redelivered event is kept once: event_id).
CREATE TABLE IF NOT EXISTS fleet_events
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    kind LowCardinality(String),
    dc LowCardinality(String),
    model LowCardinality(String),
    model_version LowCardinality(String),
    tenant LowCardinality(String),
    delta Int32,
    detail String,
    worker LowCardinality(String),
    run_id LowCardinality(String) DEFAULT '',
    run_policy LowCardinality(String) DEFAULT ''
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;
