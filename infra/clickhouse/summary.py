"""The run summary, read back from ClickHouse with the simulator's definitions (sim/evaluation/metrics.py).

Per request (its attempts grouped by ``request_id``; the last attempt decides the outcome):
``completed`` = last attempt ok; TTFT percentiles by nearest rank over every request, one without
a first token counting as infinite (None when a percentile lands there). Rates divide by the
data's window, max(completion ts) - min(arrival_ts), the same for every class:
``output_tokens_per_s`` counts every attempt's tokens, aborted ones included;
``goodput_tokens_per_s`` the tokens of requests whose last attempt met its SLO (``met_slo``);
``compliant_share`` = goodput / output throughput.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

EVENT_TABLES = ("requests", "admission_decisions", "routing_decisions", "completions")

_SINCE = (
    "ts >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC') AND ({run:String} = '' OR run_id = {run:String})"
)

_WINDOW_SQL = f"""
SELECT count(), min(toUnixTimestamp64Milli(arrival_ts)) / 1000, max(toUnixTimestamp64Milli(ts)) / 1000
FROM completions FINAL
WHERE {_SINCE}
"""

# WITH ROLLUP adds the all-classes row, marked by grouping(slo_class) = 1.
_PER_CLASS_SQL = f"""
WITH per_request AS (
    SELECT
        slo_class,
        request_id,
        count() AS attempts,
        argMax(status, attempt) AS last_status,
        argMax(ifNull(ttft_s, inf), attempt) AS last_ttft_s,
        argMax(output_tokens * met_slo, attempt) AS good_tokens,
        sum(output_tokens) AS attempt_tokens
    FROM completions FINAL
    WHERE {_SINCE}
    GROUP BY slo_class, request_id
)
SELECT
    slo_class,
    grouping(slo_class) AS is_total,
    count() AS requests,
    sum(attempts) AS completions,
    countIf(last_status = 'ok') AS completed,
    countIf(last_status = 'aborted') AS aborted,
    countIf(last_status = 'timeout') AS timeout,
    countIf(last_status = 'error') AS error,
    quantileExactLow(0.5)(last_ttft_s) AS ttft_p50_s,
    quantileExactLow(0.95)(last_ttft_s) AS ttft_p95_s,
    sum(attempt_tokens) AS output_tokens,
    sum(good_tokens) AS good_tokens
FROM per_request
GROUP BY slo_class WITH ROLLUP
ORDER BY is_total, slo_class
"""


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
    WHERE action IN ('queue', 'reject') AND {_SINCE}
)
GROUP BY slo_class, action, why
ORDER BY slo_class, action, requests DESC, why
"""


def admissions(
    client: Client, since_ts: float | None = None, run_id: str = "", top: int = 3
) -> dict[str, dict[str, Any]]:
    """Per class: ``rejected`` and ``held`` (distinct requests), and for each its ``top``
    reasons as ``{reason: requests}`` (``rejects_by_reason``, ``holds_by_reason``). A request
    held and later rejected counts in both. A reject's reason is its code (``expired``); a
    hold's is its text with each number replaced by the range it took over the holds of that
    cause (``predicted TTFT 1.42 to 1.61 s over 1.25 to 1.30 s (headroom and margin)``)."""
    since = {"since_ms": 0 if since_ts is None else int(since_ts * 1000), "run": run_id}
    per_class: dict[str, dict[str, Any]] = {}
    rows = client.query(_ADMISSIONS_SQL, parameters=since).result_rows
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

_COSTS_SQL = """
SELECT
    sumIf(gpu_seconds, slo_class NOT IN ('(idle)', '(unattributed)')) AS attributed,
    sumIf(gpu_seconds, slo_class = '(unattributed)') AS unattributed,
    sumIf(gpu_seconds, slo_class = '(idle)') AS idle,
    sum(wasted_gpu_seconds) AS wasted,
    sum(cost) AS cost,
    sum(goodput_tokens) AS good,
    (SELECT sum(priced_seconds) FROM instance_minutes
     WHERE minute >= toStartOfMinute(fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC'))
       AND ({run:String} = '' OR run_id = {run:String})) AS priced
FROM cost_per_minute
WHERE minute >= toStartOfMinute(fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC'))
  AND ({run:String} = '' OR run_id = {run:String})
"""


def costs(client: Client, since_ts: float | None = None, run_id: str = "") -> dict[str, float | None]:
    """What the run's compliant tokens cost (``cost_per_minute``, whole minutes from the one
    ``since_ts`` falls in): GPU-seconds attributed to requests, busy but unattributed, and idle;
    wasted GPU-seconds; the fleet's whole cost (idle included) and
    ``cost_per_million_goodput_tokens`` = cost / compliant tokens x 1e6 (None without any, or
    when no instance has a price: then the GPU-seconds are the figures)."""
    since = {"since_ms": 0 if since_ts is None else int(since_ts * 1000), "run": run_id}
    row = client.query(_COSTS_SQL, parameters=since).result_rows[0]
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


def summary(client: Client, since_ts: float | None = None, run_id: str = "") -> dict[str, object]:
    """``{"window_s", "clickhouse_rows", "total": {...}, "per_class": {CLASS: {...}}}``.

    Each class (and ``total``) has: requests, completions (attempts ended), completed, aborted,
    timeout, error, ttft_p50_s, ttft_p95_s, output_tokens_per_s, goodput_tokens_per_s,
    compliant_share. Where admission held or rejected requests, each class also has ``rejected``,
    ``held`` and their top reasons (``admissions``), and ``total`` the two counts. Only events
    with ``ts >= since_ts`` (default: all) of run ``run_id`` (the ``run_id`` column the sink
    stamps; "" = every run) count. ``cost``: what its compliant tokens cost (``costs``).
    """
    since = {"since_ms": 0 if since_ts is None else int(since_ts * 1000), "run": run_id}
    count, first_arrival, last_end = client.query(_WINDOW_SQL, parameters=since).result_rows[0]
    window_s = max(float(last_end) - float(first_arrival), 1e-9) if count else 0.0
    per_class: dict[str, dict[str, Any]] = {}
    total: dict[str, object] = {}
    if count:
        result = client.query(_PER_CLASS_SQL, parameters=since)
        for row in result.named_results():
            metrics = _metrics(row, window_s)
            if row["is_total"]:
                total = metrics
            else:
                per_class[str(row["slo_class"])] = metrics
    answers = admissions(client, since_ts, run_id)
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
        "cost": costs(client, since_ts, run_id),
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
