-- The engine's own KV block size in tokens (vLLM's block_size; 0 = not known): what a replay's
-- calibrated engine allocates a running request's cache in (tokenfleet replay calibrate).
ALTER TABLE heartbeats
    ADD COLUMN IF NOT EXISTS kv_block_tokens UInt32 DEFAULT 0;
