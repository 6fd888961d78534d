-- SLOMax's control loop: one row per control step, with what it read and what it changed, so an
-- operator sees why a threshold or a share moved (or why the loop held: stale feedback).
CREATE TABLE IF NOT EXISTS slomax_adjustments
(
    ts DateTime64(3, 'UTC'),
    policy LowCardinality(String),
    action LowCardinality(String),
    reason String,
    interactive_met_share Nullable(Float64),
    batch_misses UInt32,
    headroom_before Float64,
    headroom_after Float64,
    batch_share_before Float64,
    batch_share_after Float64
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (policy, ts);
