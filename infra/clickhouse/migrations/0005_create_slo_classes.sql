-- The SLO thresholds the sink judged completions by (configuration, synced at start).
-- The newest row per name wins: read with FINAL.
CREATE TABLE IF NOT EXISTS slo_classes
(
    name LowCardinality(String),
    ttft_s Nullable(Float64),
    tpot_s Nullable(Float64),
    deadline UInt8,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY name;
