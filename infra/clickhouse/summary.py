"""The run summary, read back from ClickHouse as the simulator measures a run.

It mirrors ``report`` in ``sim/evaluation/metrics.py`` (``measurement_window``, ``outcomes``,
``tokens_in_window``, ``summarize``, ``percentile``):

- the cohort: the requests (``request_id``, over every table that names one) whose first
  arrival (the earliest ``requests.ts`` or ``completions.arrival_ts`` of their attempts) is in
  ``[since_ts, until_ts)``; a request's class is the one it declared, else the one its decider
  gave it (admission, then routing), else its completion's (as ``tokenfleet replay export``);
- the window W (``measurement_window``): the span of the cohort's first arrivals; when that
  span has no length, from that instant to the last end of any attempt, at least
  ``MIN_EXTENDED_WINDOW_S``. Rates divide by |W|, the same for every class;
- per request, its last attempt decides: ``completed`` = it ended ``ok``; its TTFT counts from
  the request's first arrival (the attempt's ``ttft_s`` plus its arrival after the first),
  infinite without a first token or without a completion of that attempt (rejected, lost); a
  percentile is the nearest rank over every request of the cohort, None where it lands on an
  infinite TTFT;
- ``goodput_tokens_per_s``: the output tokens of requests whose last attempt ended inside W and
  met its class's objective (``met_slo``, and a retried request's TTFT from its first arrival
  within its class's); ``output_tokens_per_s``: every attempt's output tokens generated inside
  W, aborted ones included: all of an attempt that ended inside W, and of one still running at
  W's end the tokens its mean TPOT puts before it (the store keeps no token times; the simulator
  counts them, so here alone the two may differ by a few tokens); when W was extended, only
  attempts that ended inside it count; ``compliant_share`` = goodput / output throughput.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

EVENT_TABLES = ("requests", "admission_decisions", "routing_decisions", "completions")

MIN_EXTENDED_WINDOW_S = 1.0
"""Shortest window of a run whose requests all arrived at one instant (the simulator's
``MIN_EXTENDED_WINDOW_S``)."""

FAR_FUTURE_MS = 2**62
"""``until`` when none is given: every arrival is before it."""

_RUN = "({run:String} = '' OR run_id = {run:String})"

# Every attempt the store names, with the rank of the table that names it (the class is taken
# from the lowest rank that has one). Only requests and completions know an attempt's arrival.
# min, max and argMin ignore repeated rows, so these tables are read without FINAL.
_COHORT = f"""
    attempts AS (
        SELECT request_id, attempt, toUnixTimestamp64Milli(ts) AS arrival_ms, slo_class, 0 AS rank
        FROM requests WHERE {_RUN}
        UNION ALL
        SELECT request_id, attempt, NULL, slo_class, 1 FROM admission_decisions WHERE {_RUN}
        UNION ALL
        SELECT request_id, attempt, NULL, slo_class, 2 FROM routing_decisions WHERE {_RUN}
        UNION ALL
        SELECT request_id, attempt, toUnixTimestamp64Milli(arrival_ts), slo_class, 3 FROM completions
        WHERE {_RUN}
    ),
    cohort AS (
        SELECT
            request_id,
            min(arrival_ms) AS first_ms,
            max(attempt) AS last_attempt,
            argMinIf(slo_class, rank, slo_class != '') AS request_class
        FROM attempts
        GROUP BY request_id
        HAVING first_ms >= {{since_ms:Int64}} AND first_ms < {{until_ms:Int64}}
    )"""

_WINDOW_SQL = f"""
WITH {_COHORT}
SELECT
    count(),
    min(first_ms),
    max(first_ms),
    (SELECT max(toUnixTimestamp64Milli(ts)) FROM completions
     WHERE {_RUN} AND request_id IN (SELECT request_id FROM cohort))
FROM cohort
"""


def _nearest_rank(q: float) -> str:
    """The nearest-rank ``q`` quantile (0-1) of ``ttft``, as numpy's ``inverted_cdf`` picks it:
    the sorted values' element at 0-based index max(ceil(n q - 1), 0)."""
    return f"arraySort(groupArray(ttft))[toUInt64(greatest(ceil(count() * {q} - 1), 0)) + 1]"


# Per completion (an ended attempt of the cohort): its TTFT from the request's first arrival,
# its compliant tokens (ok, met its objective, ended inside W) and its tokens generated inside W.
# Per request: its attempts' figures and its last completion, which decides only if it is the
# request's last attempt. WITH ROLLUP adds the all-classes row, marked by grouping() = 1.
_PER_CLASS_SQL = f"""
WITH {_COHORT},
    ended AS (
        SELECT
            request_id,
            count() AS completions,
            argMax((attempt, status, from_first_s, good_tokens), attempt) AS last,
            sum(window_tokens) AS generated
        FROM (
            SELECT
                c.request_id AS request_id,
                c.attempt AS attempt,
                c.status AS status,
                toUnixTimestamp64Milli(c.ts) AS end_ms,
                toUnixTimestamp64Milli(c.arrival_ts) / 1000 + c.ttft_s AS first_token_s,
                c.ttft_s + (toUnixTimestamp64Milli(c.arrival_ts) - k.first_ms) / 1000 AS from_first_s,
                c.status = 'ok' AND c.met_slo = 1 AND end_ms <= {{end_ms:Int64}}
                    AND (o.deadline = 1 OR o.objective_s IS NULL OR from_first_s <= o.objective_s)
                    AS good,
                if(good, c.output_tokens, 0) AS good_tokens,
                toUInt64(multiIf(
                    end_ms <= {{end_ms:Int64}}, c.output_tokens,
                    NOT {{closed:Bool}} OR ifNull(first_token_s > {{end_ms:Int64}} / 1000, true), 0,
                    c.tpot_s IS NULL OR c.tpot_s <= 0, least(c.output_tokens, 1),
                    least(c.output_tokens, 1 + floor(({{end_ms:Int64}} / 1000 - first_token_s) / c.tpot_s))
                )) AS window_tokens
            FROM completions AS c FINAL
            INNER JOIN cohort AS k ON k.request_id = c.request_id
            LEFT JOIN (SELECT name, ttft_s AS objective_s, deadline FROM slo_classes FINAL) AS o
                ON o.name = c.slo_class
            WHERE {_RUN.replace("run_id", "c.run_id")}
        )
        GROUP BY request_id
    ),
    judged AS (
        SELECT
            cohort.request_class AS slo_class,
            ended.completions AS completions,
            ended.completions > 0 AND ended.last.1 = cohort.last_attempt AS decides,
            if(decides, ended.last.2, '') AS last_status,
            if(decides, ifNull(ended.last.3, inf), inf) AS ttft,
            if(decides, ended.last.4, 0) AS good_tokens,
            ended.generated AS generated
        FROM cohort
        LEFT JOIN ended ON ended.request_id = cohort.request_id
    )
SELECT
    slo_class,
    grouping(slo_class) AS is_total,
    count() AS requests,
    sum(completions) AS completions,
    countIf(last_status = 'ok') AS completed,
    countIf(last_status = 'aborted') AS aborted,
    countIf(last_status = 'timeout') AS timeout,
    countIf(last_status = 'error') AS error,
    {_nearest_rank(0.5)} AS ttft_p50_s,
    {_nearest_rank(0.95)} AS ttft_p95_s,
    sum(generated) AS output_tokens,
    sum(good_tokens) AS good_tokens
FROM judged
GROUP BY slo_class WITH ROLLUP
ORDER BY is_total, slo_class
"""


def measurement_window(
    count: int, first_ms: int, last_first_ms: int, last_end_ms: int | None
) -> tuple[int, int]:
    """W in Unix ms, as ``measurement_window`` in ``sim/evaluation/metrics.py`` takes it: the span
    of the ``count`` first arrivals ``[first_ms, last_first_ms]`` if it has any length, else from
    that instant to the last end of any attempt (``last_end_ms``; None: none ended), at least
    ``MIN_EXTENDED_WINDOW_S`` long; ``(0, 0)`` for no request."""
    if not count:
        return (0, 0)
    if last_first_ms > first_ms:
        return (first_ms, last_first_ms)
    last = first_ms if last_end_ms is None else max(last_end_ms, first_ms)
    return (first_ms, max(last, first_ms + int(MIN_EXTENDED_WINDOW_S * 1000)))


def _bounds(since_ts: float | None, until_ts: float | None, run_id: str) -> dict[str, object]:
    return {
        "since_ms": 0 if since_ts is None else int(since_ts * 1000),
        "until_ms": FAR_FUTURE_MS if until_ts is None else int(until_ts * 1000),
        "run": run_id,
    }


_EVENTS = (
    f"ts >= fromUnixTimestamp64Milli({{since_ms:Int64}}, 'UTC') "
    f"AND ts < fromUnixTimestamp64Milli({{until_ms:Int64}}, 'UTC') AND {_RUN}"
)

_NUMBER = "[0-9]+[.][0-9]+|[0-9]+"

# One row per (class, answer, reason): a reject's reason by its code (the text before ':'), a
# hold's by its text with the numbers taken out, so holds for one cause group together; for a
# hold also one of its texts and, position by position, the lowest and highest of its numbers.
_ADMISSIONS_SQL = f"""
SELECT slo_class, action, why, uniqExact(request_id) AS requests, any(text) AS example,
       minForEach(numbers) AS low, maxForEach(numbers) AS high
FROM (
    SELECT
        slo_class,
        action,
        request_id,
        replaceRegexpOne(reason, '^[a-z+-]+: ', '') AS text,
        if(action = 'reject', splitByChar(':', reason)[1], replaceRegexpAll(text, '{_NUMBER}', 'N')) AS why,
        arrayMap(x -> toFloat64(x), extractAll(text, '{_NUMBER}')) AS numbers
    FROM admission_decisions FINAL
    WHERE action IN ('queue', 'reject') AND {_EVENTS}
)
GROUP BY slo_class, action, why
ORDER BY slo_class, action, requests DESC, why
"""


def admissions(
    client: Client,
    since_ts: float | None = None,
    run_id: str = "",
    top: int = 3,
    until_ts: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Per class: ``rejected`` and ``held`` (distinct requests), and for each its ``top``
    reasons as ``{reason: requests}`` (``rejects_by_reason``, ``holds_by_reason``), over the
    decisions taken in ``[since_ts, until_ts)``. A request held and later rejected counts in
    both. A reject's reason is its code (``expired``); a hold's is its text with each number
    replaced by the range it took over the holds of that cause (``predicted TTFT LOW to HIGH s
    over LOW to HIGH s (headroom and margin)``)."""
    per_class: dict[str, dict[str, Any]] = {}
    rows = client.query(_ADMISSIONS_SQL, parameters=_bounds(since_ts, until_ts, run_id)).result_rows
    for slo_class, action, why, requests, example, low, high in rows:
        entry = per_class.setdefault(
            str(slo_class), {"rejected": 0, "held": 0, "rejects_by_reason": {}, "holds_by_reason": {}}
        )
        count, reasons = (
            ("rejected", "rejects_by_reason") if action == "reject" else ("held", "holds_by_reason")
        )
        entry[count] += int(requests)
        if len(entry[reasons]) < top:
            told = str(why) if action == "reject" else with_ranges(str(example), low, high)
            entry[reasons][told] = int(requests)
    return per_class


def with_ranges(text: str, low: Sequence[float], high: Sequence[float]) -> str:
    """``text`` with its i-th number replaced by ``low[i]`` (``low[i] to high[i]`` when they
    differ), each written with as many decimals as that number in ``text``."""
    spans = iter(zip(low, high, strict=True))

    def span(match: re.Match[str]) -> str:
        decimals = len(match.group().partition(".")[2])
        least, most = next(spans)
        return f"{least:.{decimals}f}" if least == most else f"{least:.{decimals}f} to {most:.{decimals}f}"

    return re.sub(_NUMBER, span, text)


_COUNTS = ("requests", "completions", "completed", "aborted", "timeout", "error")

_MINUTES = (
    "minute >= toStartOfMinute(fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')) "
    "AND minute < fromUnixTimestamp64Milli({until_ms:Int64}, 'UTC') "
    "AND ({run:String} = '' OR run_id = {run:String})"
)

_COSTS_SQL = f"""
SELECT
    sumIf(gpu_seconds, slo_class NOT IN ('(idle)', '(unattributed)')) AS attributed,
    sumIf(gpu_seconds, slo_class = '(unattributed)') AS unattributed,
    sumIf(gpu_seconds, slo_class = '(idle)') AS idle,
    sum(wasted_gpu_seconds) AS wasted,
    sum(cost) AS cost,
    sum(goodput_tokens) AS good,
    (SELECT sum(priced_seconds) FROM instance_minutes WHERE {_MINUTES}) AS priced
FROM cost_per_minute
WHERE {_MINUTES}
"""


def costs(
    client: Client, since_ts: float | None = None, run_id: str = "", until_ts: float | None = None
) -> dict[str, float | None]:
    """What the run's compliant tokens cost (``cost_per_minute``, the whole minutes that overlap
    ``[since_ts, until_ts)``): GPU-seconds attributed to requests, busy but unattributed, and
    idle; wasted GPU-seconds; the fleet's whole cost (idle included) and
    ``cost_per_million_goodput_tokens`` = cost / compliant tokens x 1e6 (None without any, or
    when no instance has a price: then the GPU-seconds are the figures)."""
    row = client.query(_COSTS_SQL, parameters=_bounds(since_ts, until_ts, run_id)).result_rows[0]
    attributed, unattributed, idle, wasted, cost, good, priced = row
    return {
        "gpu_seconds_busy": round(_number(attributed) + _number(unattributed), 3),
        "gpu_seconds_idle": round(_number(idle), 3),
        "wasted_gpu_seconds": round(_number(wasted), 3),
        "cost": round(_number(cost), 6),
        "cost_per_million_goodput_tokens": (
            round(_number(cost) / _number(good) * 1e6, 4) if good and priced else None
        ),
    }


def clickhouse_rows(client: Client, run_id: str = "") -> int:
    """Distinct events stored across the four event tables (of run ``run_id``; "" = all)."""
    where = "WHERE run_id = {run:String}" if run_id else ""
    counts = " + ".join(f"(SELECT count() FROM {table} FINAL {where})" for table in EVENT_TABLES)
    return int(client.query(f"SELECT {counts}", parameters={"run": run_id}).result_rows[0][0])


_RUN_POLICY_SQL = "SELECT any(run_policy) FROM requests WHERE run_id = {run:String} AND run_policy != ''"


def run_policy(client: Client, run_id: str) -> str:
    """The policy run ``run_id`` ran (the ``run_policy`` its requests carry); "" if none recorded."""
    return str(client.query(_RUN_POLICY_SQL, parameters={"run": run_id}).result_rows[0][0])


def summary(
    client: Client, since_ts: float | None = None, run_id: str = "", until_ts: float | None = None
) -> dict[str, object]:
    """``{"window_s", "clickhouse_rows", "total": {...}, "per_class": {CLASS: {...}}, "cost"}``
    of run ``run_id`` (the ``run_id`` column the sink stamps; "" = every run), over the requests
    first arriving in ``[since_ts, until_ts)`` (None: unbounded), as the module docstring
    defines them.

    Each class (and ``total``) has: requests (the cohort's), completions (their attempts that
    ended), completed, aborted, timeout, error (by the last attempt's status; a request whose
    last attempt has no completion counts in none), ttft_p50_s, ttft_p95_s,
    output_tokens_per_s, goodput_tokens_per_s, compliant_share. Where admission held or rejected
    requests (decisions taken in ``[since_ts, until_ts)``), each class also has ``rejected``,
    ``held`` and their top reasons (``admissions``), and ``total`` the two counts. ``window_s``:
    |W|. ``cost``: what the compliant tokens cost (``costs``, over the same bounds).
    """
    bounds = _bounds(since_ts, until_ts, run_id)
    count, first_ms, last_first_ms, last_end_ms = client.query(_WINDOW_SQL, parameters=bounds).result_rows[0]
    start_ms, end_ms = measurement_window(
        int(count), int(first_ms or 0), int(last_first_ms or 0), last_end_ms
    )
    window_s = max((end_ms - start_ms) / 1000, 1e-9) if count else 0.0
    per_class: dict[str, dict[str, Any]] = {}
    total: dict[str, object] = {}
    if count:
        closed = last_first_ms > first_ms  # W is the arrivals' span: attempts running at its end count
        parameters = {**bounds, "end_ms": end_ms, "closed": closed}
        for row in client.query(_PER_CLASS_SQL, parameters=parameters).named_results():
            metrics = _metrics(row, window_s)
            if row["is_total"]:
                total = metrics
            else:
                per_class[str(row["slo_class"])] = metrics
    answers = admissions(client, since_ts, run_id, until_ts=until_ts)
    for name, entry in answers.items():
        per_class.setdefault(name, {}).update(entry)
    if answers:
        total["rejected"] = sum(e["rejected"] for e in answers.values())
        total["held"] = sum(e["held"] for e in answers.values())
    return {
        "window_s": round(window_s, 6),
        "clickhouse_rows": clickhouse_rows(client, run_id),
        "total": total,
        "per_class": per_class,
        "cost": costs(client, since_ts, run_id, until_ts),
    }


def _metrics(row: dict[str, object], window_s: float) -> dict[str, object]:
    output_tokens = _number(row["output_tokens"])
    good_tokens = _number(row["good_tokens"])
    counts = {key: int(_number(row[key])) for key in _COUNTS}
    return {
        **counts,
        "ttft_p50_s": _finite(row["ttft_p50_s"]),
        "ttft_p95_s": _finite(row["ttft_p95_s"]),
        "output_tokens_per_s": round(output_tokens / window_s, 6),
        "goodput_tokens_per_s": round(good_tokens / window_s, 6),
        "compliant_share": round(good_tokens / output_tokens, 6) if output_tokens else 0.0,
    }


def _number(value: object) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number from ClickHouse, got {value!r}")
    return float(value)


def _finite(value: object) -> float | None:
    number = _number(value)
    return None if math.isinf(number) or math.isnan(number) else round(number, 6)
