-- SLOMax's rejects carry a retry-after hint: when trying again could succeed.
ALTER TABLE admission_decisions
    ADD COLUMN IF NOT EXISTS retry_after_s Nullable(Float64) AFTER predicted_ttft_s;
