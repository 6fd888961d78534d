-- The planner's plans (tf.plans): one row per ReplicaPlan, the replicas wanted of a model version
-- in a data centre, the models whose weights the DC should keep staged (warm; warm_given = 0: the
-- plan left them unchanged) and why. A redelivered plan is kept once (event_id).
CREATE TABLE IF NOT EXISTS replica_plans
(
    event_id String,
    ts DateTime64(3, 'UTC'),
    schema_version UInt8,
    planner LowCardinality(String),
    model LowCardinality(String),
    model_version LowCardinality(String),
    dc LowCardinality(String),
    replicas UInt32,
    warm Array(LowCardinality(String)),
    warm_given UInt8,
    reason String,
    worker LowCardinality(String),
    run_id LowCardinality(String) DEFAULT '',
    run_policy LowCardinality(String) DEFAULT ''
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY event_id;

-- Starts and drains, from the heartbeats: an instance being removed says draining = 1 until it
-- stops (a start is its first beat, loading: endpoint_ready = 0).
ALTER TABLE heartbeats
    ADD COLUMN IF NOT EXISTS draining UInt8 DEFAULT 0;
