-- One row per instance heartbeat the worker consumed: the raw material of capacity and cost.
-- interval_s is the heartbeat interval in force (each beat stands for that much of the
-- instance's time); kept 7 days, the per-minute roll-up (0014) for good.
CREATE TABLE IF NOT EXISTS heartbeats
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    instance_id LowCardinality(String),
    dc LowCardinality(String),
    model LowCardinality(String),
    profile LowCardinality(String),
    endpoint_ready UInt8,
    waiting UInt32,
    running UInt32,
    kv_blocks_used UInt32,
    kv_blocks_total UInt32,
    gpus UInt16,
    price_per_hour Nullable(Float64),
    interval_s Float64,
    run_id LowCardinality(String) DEFAULT '',
    run_policy LowCardinality(String) DEFAULT ''
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY event_id
TTL toDateTime(ts) + INTERVAL 7 DAY;
