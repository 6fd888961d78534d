-- Prefill/decode disaggregation in the store: the instance that prefilled a routed request first
-- ('' = it ran whole on instance_id; a replay or a calibration tells the two apart), and how
-- many of a plan's replicas run prefill only (NULL = the pool keeps the ones it runs).
ALTER TABLE routing_decisions
    ADD COLUMN IF NOT EXISTS prefill_instance_id String DEFAULT '';
ALTER TABLE replica_plans
    ADD COLUMN IF NOT EXISTS prefill_replicas Nullable(UInt32);
