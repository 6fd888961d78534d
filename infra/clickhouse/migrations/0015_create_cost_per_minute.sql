-- What a compliant token costs, per minute, run, pool, tenant and class (read with sum() and
-- GROUP BY; cost per million compliant tokens = sum(cost) / sum(goodput_tokens) * 1e6).
--
-- The attribution is an estimate, from what real engines report: the busy GPU-seconds (and busy
-- cost) of an instance in a minute (instance_minutes, from heartbeats) are split among the
-- attempts that ended on it in that minute, by their share of the tokens it processed: uncached
-- prompt tokens plus output tokens (completions). wasted_gpu_seconds is the part of attempts that
-- delivered no compliant output (met_slo = 0: aborted, timed out, failed, retried, or finished
-- outside their objective). Capacity is reported apart, never in a tenant's figures:
-- slo_class '(idle)' is the time instances existed with nothing running, '(unattributed)' the
-- busy time of instance-minutes in which no attempt ended (long requests still running).
-- gpu_seconds is busy time for a tenant's class, idle time for '(idle)'. An instance without a
-- price has cost 0 and its GPU-seconds only.
CREATE VIEW IF NOT EXISTS cost_per_minute AS
WITH
    capacity AS (
        SELECT minute, run_id, model, instance_id,
               sum(gpu_seconds) AS gpu_s, sum(busy_gpu_seconds) AS busy_gpu_s,
               sum(cost) AS all_cost, sum(busy_cost) AS busy_all_cost
        FROM instance_minutes
        GROUP BY minute, run_id, model, instance_id
    ),
    work AS (
        SELECT toStartOfMinute(ts) AS minute, run_id, instance_id, model, tenant, slo_class,
               toFloat64(sum(greatest(toInt64(input_tokens) - toInt64(cached_tokens), 0) + output_tokens)) AS tokens,
               toFloat64(sumIf(greatest(toInt64(input_tokens) - toInt64(cached_tokens), 0) + output_tokens,
                               met_slo = 0)) AS wasted_tokens,
               sumIf(completions.output_tokens, met_slo = 1) AS good_tokens,
               sum(completions.output_tokens) AS out_tokens,
               count() AS ended
        FROM completions
        GROUP BY minute, run_id, instance_id, model, tenant, slo_class
    ),
    shares AS (
        SELECT *, sum(tokens) OVER (PARTITION BY minute, run_id, instance_id) AS instance_tokens
        FROM work
    ),
    attributed AS (
        SELECT s.minute AS minute, s.run_id AS run_id, s.model AS pool, s.tenant AS tenant,
               s.slo_class AS slo_class,
               if(s.instance_tokens > 0, s.tokens / s.instance_tokens, 0) AS share,
               if(s.instance_tokens > 0, s.wasted_tokens / s.instance_tokens, 0) AS wasted_share,
               c.busy_gpu_s AS busy_gpu_s, c.busy_all_cost AS busy_all_cost,
               s.good_tokens AS good_tokens, s.out_tokens AS out_tokens, s.ended AS ended
        FROM shares AS s
        LEFT JOIN capacity AS c
            ON c.minute = s.minute AND c.run_id = s.run_id AND c.instance_id = s.instance_id
    ),
    worked AS (
        SELECT DISTINCT minute, run_id, instance_id FROM shares WHERE instance_tokens > 0
    )
SELECT minute, run_id, pool, tenant, slo_class,
       sum(busy_gpu_s * share) AS gpu_seconds,
       sum(busy_gpu_s * wasted_share) AS wasted_gpu_seconds,
       sum(busy_all_cost * share) AS cost,
       sum(good_tokens) AS goodput_tokens,
       sum(out_tokens) AS output_tokens,
       sum(ended) AS attempts
FROM attributed
GROUP BY minute, run_id, pool, tenant, slo_class
UNION ALL
SELECT c.minute, c.run_id, c.model, '', '(unattributed)',
       sum(c.busy_gpu_s), 0, sum(c.busy_all_cost), 0, 0, 0
FROM capacity AS c
LEFT ANTI JOIN worked AS w ON c.minute = w.minute AND c.run_id = w.run_id AND c.instance_id = w.instance_id
GROUP BY c.minute, c.run_id, c.model
UNION ALL
SELECT minute, run_id, model, '', '(idle)',
       sum(gpu_s - busy_gpu_s), 0, sum(all_cost - busy_all_cost), 0, 0, 0
FROM capacity
GROUP BY minute, run_id, model;
