-- Per-minute, per-class roll-up of completions (by completion time), filled by the view in
-- 0007. SummingMergeTree adds rows up only when parts merge: always read with sum() and
-- GROUP BY minute, slo_class.
CREATE TABLE IF NOT EXISTS goodput_per_minute
(
    minute DateTime('UTC'),
    slo_class LowCardinality(String),
    completions UInt64,
    ok UInt64,
    good UInt64,
    aborted UInt64,
    timeout UInt64,
    error UInt64,
    output_tokens UInt64,
    good_tokens UInt64
)
ENGINE = SummingMergeTree
ORDER BY (minute, slo_class);
