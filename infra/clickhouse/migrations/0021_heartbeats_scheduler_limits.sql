-- The engine scheduler's limits its deployment declares (0 = not known): the requests it runs at
-- once (vLLM's max_num_seqs) and the tokens one step computes (max_num_batched_tokens), what a
-- replay's calibrated engine schedules under (tokenfleet replay calibrate).
ALTER TABLE heartbeats
    ADD COLUMN IF NOT EXISTS max_seqs UInt32 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS prefill_budget_tokens UInt32 DEFAULT 0;
