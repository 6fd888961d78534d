-- What a replay of a run needs (tokenfleet replay export), and nothing of a prompt's text:
-- each request's prompt block-hash chain (hashes of its full 512-token blocks, as the request
-- carried them) and the model version it must run on. Old rows: an empty chain (replayed
-- without prefix reuse) and no version.
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS prompt_block_hashes Array(Int64) DEFAULT [],
    ADD COLUMN IF NOT EXISTS model_version LowCardinality(String) DEFAULT '';
-- The chain the decider routed on: a request published with its prompt's text and no hashes
-- (an OpenAI batch line) is stored as published, and only its routing decision carries the
-- hashes the worker computed.
ALTER TABLE routing_decisions
    ADD COLUMN IF NOT EXISTS prompt_block_hashes Array(Int64) DEFAULT [];
-- The version each instance served, so the exported fleet serves the versions requests ask for.
ALTER TABLE heartbeats
    ADD COLUMN IF NOT EXISTS model_version LowCardinality(String) DEFAULT '';
