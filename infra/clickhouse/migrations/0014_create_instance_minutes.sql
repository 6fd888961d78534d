-- Per-minute capacity of each instance, from its heartbeats: GPU-seconds it existed and was busy
-- (a beat with a running request counts its interval as busy), and what they cost at its price.
-- SummingMergeTree adds rows up only when parts merge: always read with sum() and GROUP BY. Like
-- goodput_per_minute_mv, the view sees each inserted block once: the sink never inserts an
-- event_id that is already stored.
CREATE TABLE IF NOT EXISTS instance_minutes
(
    minute DateTime('UTC'),
    run_id LowCardinality(String),
    model LowCardinality(String),
    dc LowCardinality(String),
    instance_id LowCardinality(String),
    gpu_seconds Float64,
    busy_gpu_seconds Float64,
    priced_seconds Float64,
    cost Float64,
    busy_cost Float64
)
ENGINE = SummingMergeTree
ORDER BY (minute, run_id, model, dc, instance_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS instance_minutes_mv TO instance_minutes AS
SELECT
    toStartOfMinute(ts) AS minute,
    run_id,
    model,
    dc,
    instance_id,
    sum(interval_s * gpus) AS gpu_seconds,
    sumIf(interval_s * gpus, running > 0) AS busy_gpu_seconds,
    sumIf(interval_s, price_per_hour IS NOT NULL) AS priced_seconds,
    sum(interval_s * ifNull(price_per_hour, 0) / 3600) AS cost,
    sumIf(interval_s * ifNull(price_per_hour, 0) / 3600, running > 0) AS busy_cost
FROM heartbeats
GROUP BY minute, run_id, model, dc, instance_id;
