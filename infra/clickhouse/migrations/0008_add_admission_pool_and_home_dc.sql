-- The scheduler pipeline: an admission decision names the queue pool that holds the request and
-- the predicted TTFT it was based on; a request may name the data centre it entered at.
ALTER TABLE admission_decisions
    ADD COLUMN IF NOT EXISTS queue_pool LowCardinality(String) DEFAULT '' AFTER policy,
    ADD COLUMN IF NOT EXISTS predicted_ttft_s Nullable(Float64) AFTER queue_pool;
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS home_dc LowCardinality(String) DEFAULT '' AFTER true_output_tokens;
