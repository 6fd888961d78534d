"""The Grafana dashboards against real data: every ClickHouse panel query runs on a store filled
by a short real demo (embedded broker, worker, emulated fleet) and returns rows; every PromQL
expression names only metrics and labels the worker exports.

Grafana macros are expanded the way grafana-clickhouse-datasource's backend expands them
(``pkg/macros/macros.go``) over a time range covering all the data; any other ``$`` variable left
in a query fails the test, so a dashboard cannot quietly depend on something this test skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clickhouse_connect.driver.client import Client
from prometheus_client.parser import text_string_to_metric_families

from infra import metrics
from infra.clickhouse.client import connect

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
CLICKHOUSE_UID = "tokenfleet-clickhouse"
PROMETHEUS_UID = "tokenfleet-prometheus"
TIMESERIES_FORMAT, TABLE_FORMAT = 0, 1  # the plugin's (sqlds) format option values

DEMO_SECONDS = 15


# -- Grafana ClickHouse macros -------------------------------------------------------------------


class MacroError(ValueError):
    """A query uses a macro or variable this test does not know, or passes it bad arguments."""


def expand_macros(sql: str, from_s: int, to_s: int, interval_s: int) -> str:
    """``sql`` with the plugin's macros expanded for the range ``[from_s, to_s]`` (Unix seconds)
    and an ``interval_s`` bucket; raises ``MacroError`` on anything it does not know."""

    def date_time(t: int) -> str:
        return f"toDateTime({t})"

    def date_time64(t: int) -> str:
        return f"fromUnixTimestamp64Milli({t * 1000})"

    def date(t: int) -> str:
        return "toDate('{}')".format(time.strftime("%Y-%m-%d", time.gmtime(t)))

    def between(column: str, low: str, high: str) -> str:
        return f"{column} >= {low} AND {column} <= {high}"

    expansions: dict[str, tuple[int, Callable[..., str]]] = {
        "fromTime": (0, lambda: date_time(from_s)),
        "toTime": (0, lambda: date_time(to_s)),
        "fromTime_ms": (0, lambda: date_time64(from_s)),
        "toTime_ms": (0, lambda: date_time64(to_s)),
        "timeFilter": (1, lambda c: between(c, date_time(from_s), date_time(to_s))),
        "timeFilter_ms": (1, lambda c: between(c, date_time64(from_s), date_time64(to_s))),
        "dateFilter": (1, lambda c: between(c, date(from_s), date(to_s))),
        "timeInterval": (1, lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {interval_s} second)"),
        "timeInterval_ms": (
            1,
            lambda c: f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {interval_s * 1000} millisecond)",
        ),
        "interval_s": (0, lambda: str(interval_s)),
    }

    def expand(match: re.Match[str]) -> str:
        name, args_text = match.group(1), match.group(2)
        if name not in expansions:
            raise MacroError(f"unknown macro $__{name} in: {sql}")
        arity, render = expansions[name]
        args = [a.strip() for a in args_text.split(",")] if args_text is not None else []
        if len(args) != arity or not all(args):
            raise MacroError(f"$__{name} takes {arity} argument(s), got {args_text!r} in: {sql}")
        return render(*args)

    # \b keeps $__timeFilter from matching the start of $__timeFilter_ms; arguments never nest.
    expanded = re.sub(r"\$__(\w+)\b(?:\(([^()]*)\))?", expand, sql)
    if "$" in expanded:
        raise MacroError(f"unexpanded variable left in: {expanded}")
    return expanded


def test_macro_expansion_matches_the_plugin_and_rejects_unknown_ones() -> None:
    sql = (
        "SELECT $__timeInterval(ts) AS t, $__interval_s FROM x "
        "WHERE $__timeFilter(minute) AND $__timeFilter_ms(ts) AND $__fromTime < $__toTime"
    )
    assert expand_macros(sql, 0, 60, 10) == (
        "SELECT toStartOfInterval(toDateTime(ts), INTERVAL 10 second) AS t, 10 FROM x "
        "WHERE minute >= toDateTime(0) AND minute <= toDateTime(60) "
        "AND ts >= fromUnixTimestamp64Milli(0) AND ts <= fromUnixTimestamp64Milli(60000) "
        "AND toDateTime(0) < toDateTime(60)"
    )
    for bad in (
        "SELECT 1 WHERE $__timeFilterz(ts)",
        "SELECT $__unixEpochFilter(ts)",
        "SELECT 1 WHERE $__timeFilter(ts, other)",
        "SELECT 1 WHERE $__timeFilter",
        "SELECT 1 WHERE slo_class IN ($slo_class)",
    ):
        with pytest.raises(MacroError):
            expand_macros(bad, 0, 60, 10)


# -- dashboard documents ---------------------------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return document


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in document["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p.get("type") != "row"]


def clickhouse_targets() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{panel['title']} [{target['refId']}]", target)
        for panel in panels(load("goodput.json"))
        for target in panel["targets"]
    ]


def test_dashboards_are_well_formed() -> None:
    for name, uid in (("goodput.json", CLICKHOUSE_UID), ("scheduler.json", PROMETHEUS_UID)):
        document = load(name)
        assert document["uid"] and document["title"]
        ids = [p["id"] for p in panels(document)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels(document):
            assert panel["targets"], f"{name}: {panel['title']} has no query"
            assert panel["datasource"]["uid"] == uid
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), f"{name}: {panel['title']}: duplicate refIds"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid
    for title, target in clickhouse_targets():
        assert target["datasource"]["type"] == "grafana-clickhouse-datasource", title
        assert target["editorType"] == "sql", title
        assert target["rawSql"].strip(), title
        assert target["format"] in (TIMESERIES_FORMAT, TABLE_FORMAT), title


def test_provisioning_defines_the_data_sources_the_dashboards_use() -> None:
    provisioning = DASHBOARDS / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "tokenfleet.yaml").read_text())["datasources"]
    by_uid = {source["uid"]: source for source in sources}
    assert by_uid[CLICKHOUSE_UID]["type"] == "grafana-clickhouse-datasource"
    assert by_uid[CLICKHOUSE_UID]["jsonData"]["defaultDatabase"] == "tokenfleet"
    assert by_uid[PROMETHEUS_UID]["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tokenfleet.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


# -- ClickHouse panels on a demo's data ------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A data dir filled by a real demo run (``python -m lab.demo_cli``, ``slomax+tokenpilot``),
    and its JSON summary."""
    data_dir = tmp_path_factory.mktemp("dashboards-demo")
    summary = data_dir / "demo.json"
    command = [
        sys.executable,
        "-m",
        "lab.demo_cli",
        "--policy",
        "slomax+tokenpilot",  # so the SLOMax panels (control steps) have data too
        "--duration",
        str(DEMO_SECONDS),
        "--json",
        str(summary),
    ]
    # Any free web port: a worker or demo running elsewhere on this machine may hold 6066.
    env = {**os.environ, "TOKENFLEET_DATA_DIR": str(data_dir), "TOKENFLEET_WORKER_WEB_PORT": "0"}
    subprocess.run(command, env=env, timeout=300, check=True)
    document: dict[str, Any] = json.loads(summary.read_text())
    return data_dir, document


@pytest.fixture(scope="module")
def store(demo_data: tuple[Path, dict[str, Any]]) -> Iterator[Client]:
    # The embedded engine serves one data dir per process: closed when this module is done.
    data_dir, _summary = demo_data
    client = connect(f"chdb:///{data_dir / 'clickhouse'}")
    try:
        yield client
    finally:
        client.close()


def run_panel_query(client: Client, target: dict[str, Any]) -> list[tuple[Any, ...]]:
    sql = expand_macros(target["rawSql"], 0, int(time.time()) + 86_400, 10)
    return [tuple(row) for row in client.query(sql).result_rows]


@pytest.mark.parametrize(("title", "target"), clickhouse_targets(), ids=[t for t, _ in clickhouse_targets()])
def test_every_clickhouse_panel_returns_rows(store: Client, title: str, target: dict[str, Any]) -> None:
    rows = run_panel_query(store, target)
    assert rows, f"{title}: no rows on the demo's data"


def test_totals_table_counts_each_completion_once(
    store: Client, demo_data: tuple[Path, dict[str, Any]]
) -> None:
    _data_dir, summary = demo_data
    (table,) = [p for p in panels(load("goodput.json")) if p["title"].startswith("Per-class totals")]
    (target,) = table["targets"]
    assert target["format"] == TABLE_FORMAT
    result = store.query(expand_macros(target["rawSql"], 0, int(time.time()) + 86_400, 10))
    attempts = result.column_names.index("attempts")
    assert sum(row[attempts] for row in result.result_rows) == summary["completions"]


def test_cost_table_accounts_for_every_gpu_second_of_the_demo(
    store: Client, demo_data: tuple[Path, dict[str, Any]]
) -> None:
    """The cost panel on the demo's store: busy time attributed to the classes, unattributed
    and idle time add up to the fleet's GPU-seconds (from the heartbeats) within 0.1 %; the
    emulated fleet has a price, so compliant tokens have a positive cost."""
    (table,) = [p for p in panels(load("goodput.json")) if p["title"].startswith("Cost per pool")]
    (target,) = table["targets"]
    result = store.query(expand_macros(target["rawSql"], 0, int(time.time()) + 86_400, 10))
    rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    fleet = store.query("SELECT sum(gpu_seconds) FROM instance_minutes").result_rows[0][0]
    assert fleet > 0
    assert sum(r["gpu_s"] for r in rows) == pytest.approx(fleet, rel=1e-3, abs=0.2)  # rounded to 0.1 s
    served = [r for r in rows if r["slo_class"] not in ("(idle)", "(unattributed)")]
    assert sum(r["good_tok"] for r in served) > 0
    assert all(r["usd_per_million_good_tok"] > 0 for r in served if r["good_tok"])


def test_a_broken_panel_query_fails(store: Client) -> None:
    """The check above can fail: a typo in a panel's SQL is an error, not an empty success."""
    _title, target = clickhouse_targets()[0]
    broken = {**target, "rawSql": target["rawSql"].replace("FROM ", "FROM missing_", 1)}
    with pytest.raises(Exception, match=r"(?i)missing_|unknown table|doesn't exist"):
        run_panel_query(store, broken)


# -- Prometheus panels against the exported metrics ------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def promql_references(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and grouping label names an expression uses (a small, strict reading:
    enough for the dashboards' expressions, never silently lenient)."""
    labels: set[str] = set()
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(name.strip() for name in clause.split(",") if name.strip())
    stripped = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|'[^']*'", " ", stripped)
    stripped = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", " ", stripped)
    if "$" in stripped:
        raise ValueError(f"unknown variable outside a range selector in: {expr}")
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped):
        followed_by_call = stripped[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group(0).lower() not in PROMQL_KEYWORDS:
            names.add(match.group(0))
    return names, labels


def exported_series() -> dict[str, set[str]]:
    """Sample name -> label names, after every metric has been touched once."""
    metrics.decisions_total.labels(policy="dashboards-test", outcome="routed").inc()
    metrics.decision_latency_seconds.observe(0.001)
    metrics.policy_latency_seconds.observe(20e-6)
    metrics.queue_depth.labels(pool="dashboards-test").set(0)
    metrics.dlq_total.labels(topic="dashboards-test").inc()
    metrics.feedback_rows_total.labels(table="dashboards-test").inc()
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_promql_reader_is_strict() -> None:
    names, labels = promql_references(
        'histogram_quantile(0.99, sum by (le) (rate(tokenfleet_x_bucket{pool="a"}[$__rate_interval])))'
    )
    assert (names, labels) == ({"tokenfleet_x_bucket"}, {"le"})
    assert promql_references("rate(tokenfleet_decision_total[5m]) / tokenfleet_y")[0] == {
        "tokenfleet_decision_total",
        "tokenfleet_y",
    }


def test_scheduler_dashboard_uses_only_exported_metrics() -> None:
    series = exported_series()
    expressions = [
        (panel["title"], target["expr"])
        for panel in panels(load("scheduler.json"))
        for target in panel["targets"]
    ]
    assert expressions
    for title, expr in expressions:
        names, labels = promql_references(expr)
        assert names, f"{title}: no metric in {expr!r}"
        unknown = names - series.keys()
        assert not unknown, f"{title}: {sorted(unknown)} not exported (have {sorted(series)})"
        available = set().union(*(series[name] for name in names))
        assert labels <= available, f"{title}: labels {sorted(labels - available)} not on {sorted(names)}"
