-- Every stored row carries the run and the policy of the worker that stored it, so the summary,
-- SQL and dashboards can read one run apart from the others in a shared store.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS run_id LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS run_policy LowCardinality(String) DEFAULT '';
ALTER TABLE admission_decisions
    ADD COLUMN IF NOT EXISTS run_id LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS run_policy LowCardinality(String) DEFAULT '';
ALTER TABLE routing_decisions
    ADD COLUMN IF NOT EXISTS run_id LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS run_policy LowCardinality(String) DEFAULT '';
ALTER TABLE completions
    ADD COLUMN IF NOT EXISTS run_id LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS run_policy LowCardinality(String) DEFAULT '';
