-- The view sees every inserted block before ReplacingMergeTree deduplicates, so it would count
-- a redelivered completion twice: the sink never inserts an event_id that is already stored.
-- Source columns are qualified because an alias (output_tokens) would shadow them.
CREATE MATERIALIZED VIEW IF NOT EXISTS goodput_per_minute_mv TO goodput_per_minute AS
SELECT
    toStartOfMinute(ts) AS minute,
    slo_class,
    count() AS completions,
    countIf(status = 'ok') AS ok,
    sum(met_slo) AS good,
    countIf(status = 'aborted') AS aborted,
    countIf(status = 'timeout') AS timeout,
    countIf(status = 'error') AS error,
    sum(completions.output_tokens) AS output_tokens,
    sumIf(completions.output_tokens, completions.met_slo = 1) AS good_tokens
FROM completions
GROUP BY minute, slo_class;
