"""The feedback store against the real embedded ClickHouse engine (chdb), one data dir per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from infra.clickhouse import FeedbackSink, connect, migrate, summary
from infra.clickhouse.client import split_database
from infra.clickhouse.migrate import load_migrations
from infra.clickhouse.summary import clickhouse_rows, costs
from schemas.events import (
    AdmissionDecision,
    Completion,
    Heartbeat,
    InferenceRequest,
    ReplicaPlan,
    RoutingDecision,
)

T0 = 1_700_000_000.0


@pytest.fixture
def sink(client: Client) -> FeedbackSink:
    return FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0)


def completion(request_id: str, **fields: Any) -> Completion:
    values: dict[str, Any] = {
        "instance_id": "i0",
        "model": "llama3-8b",
        "status": "ok",
        "arrival_ts": T0,
        "ts": T0 + 2.0,
        "ttft_s": 0.5,
        "tpot_s": 0.02,
        "e2e_s": 2.0,
        "input_tokens": 100,
        "output_tokens": 100,
    }
    values.update(fields)
    return Completion(request_id=request_id, **values)


def scalar(client: Client, sql: str) -> Any:
    return client.query(sql).result_rows[0][0]


def test_urls_name_their_database() -> None:
    assert split_database("chdb:////data/ch") == ("chdb:///data/ch", "tokenfleet")
    assert split_database("chdb:///data/ch?database=other") == ("chdb:///data/ch", "other")
    assert split_database("http://u:p@host:8123/fb") == ("http://u:p@host:8123", "fb")
    with pytest.raises(ValueError):
        split_database("http://host:8123/bad-name")


def test_migrate_applies_every_migration_once_and_records_it(tmp_path: Path) -> None:
    expected = [m.label for m in load_migrations()]
    with connect(f"chdb:///{tmp_path / 'clickhouse'}") as client:
        assert client.database == "tokenfleet"
        assert migrate(client) == expected
        assert expected[0] == "0001_create_requests" and expected == sorted(expected)
        assert migrate(client) == []
        rows = client.query("SELECT version, name FROM schema_migrations FINAL ORDER BY version").result_rows
        assert [f"{v:04d}_{n}" for v, n in rows] == expected
        tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
    for table in (
        "requests", "admission_decisions", "routing_decisions", "completions", "slo_classes", "fleet_events"
    ):  # fmt: skip
        assert table in tables
    assert {"goodput_per_minute", "goodput_per_minute_mv"} <= tables
    # The data survives the client: a reopened store has nothing left to apply.
    with connect(f"chdb:///{tmp_path / 'clickhouse'}") as client:
        assert migrate(client) == []


def test_redelivered_completion_counts_once_in_table_and_rollup(client: Client, sink: FeedbackSink) -> None:
    first, second = completion("r1"), completion("r2", output_tokens=40)
    assert sink.write_completions([first, first]) == 1  # repeated inside one batch
    assert sink.write_completions([first]) == 0  # redelivered in a later batch
    assert sink.write_completions([first, second]) == 1
    assert scalar(client, "SELECT count() FROM completions") == 2  # not even a pending duplicate
    assert scalar(client, "SELECT count() FROM completions FINAL") == 2
    rollup = client.query(
        "SELECT sum(completions), sum(good), sum(output_tokens), sum(good_tokens) FROM goodput_per_minute"
    ).result_rows[0]
    assert rollup == (2, 2, 140, 140)


@pytest.mark.parametrize(
    ("slo_class", "fields", "good"),
    [
        ("interactive", {"ttft_s": 2.0, "tpot_s": 0.1}, True),
        ("interactive", {"ttft_s": 2.1}, False),
        ("interactive", {"tpot_s": 0.11}, False),
        ("interactive", {"status": "aborted"}, False),
        ("interactive", {"ttft_s": None}, False),
        ("long_context", {"ttft_s": 14.0, "tpot_s": 0.15}, True),
        ("long_context", {"ttft_s": 16.0}, False),
        ("long_context", {"ttft_s": 1.0, "tpot_s": 0.2}, False),
        ("batch", {"ttft_s": 50.0, "e2e_s": 90.0, "deadline_ts": T0 + 100}, True),
        ("batch", {"ttft_s": 50.0, "e2e_s": 110.0, "deadline_ts": T0 + 100}, False),
        ("batch", {"status": "timeout", "deadline_ts": T0 + 100}, False),
        ("no_such_class", {}, False),
    ],
)
def test_met_slo_follows_the_class_thresholds(
    client: Client, sink: FeedbackSink, slo_class: str, fields: dict[str, Any], good: bool
) -> None:
    event = completion("r", slo_class=slo_class, **fields)
    sink.write_completions([event])
    assert scalar(client, "SELECT met_slo FROM completions FINAL") == int(good)
    assert scalar(client, "SELECT sum(good) FROM goodput_per_minute") == int(good)


def test_slo_classes_table_holds_the_thresholds_in_force(client: Client, sink: FeedbackSink) -> None:
    rows = client.query("SELECT name, ttft_s, tpot_s, deadline FROM slo_classes FINAL ORDER BY name")
    assert rows.result_rows == [
        ("batch", None, None, 1),
        ("interactive", 2.0, 0.1, 0),
        ("long_context", 15.0, 0.15, 0),
    ]


def hand_made_run() -> list[Completion]:
    """Interactive i1..i5 and batch b1, first arriving at T0 .. T0+8; with r1 (a request without
    a completion, at T0+10) the window W is T0 .. T0+10 = 10 s."""
    return [
        completion("i1", ts=T0 + 2, ttft_s=0.5, output_tokens=100),  # good
        completion(
            "i2", attempt=1, status="aborted", arrival_ts=T0 + 1, ts=T0 + 3, ttft_s=None, output_tokens=0
        ),
        # its own TTFT is 0.6 s (met_slo), but 2.6 s from the request's first arrival: not good
        completion("i2", attempt=2, arrival_ts=T0 + 3, ts=T0 + 5, ttft_s=0.6, output_tokens=50),
        completion("i3", arrival_ts=T0 + 2, ts=T0 + 6, ttft_s=3.0, output_tokens=30),  # TTFT too slow
        completion(
            "i4", status="timeout", arrival_ts=T0 + 2, ts=T0 + 8, ttft_s=None, e2e_s=None, output_tokens=0
        ),
        # running at W's end: first token at T0+8.75, then one every 0.1 s: 13 tokens inside W
        completion(
            "i5", arrival_ts=T0 + 8, ts=T0 + 13.75, ttft_s=0.75, tpot_s=0.1, e2e_s=5.75, output_tokens=51
        ),
        completion(
            "b1",
            slo_class="batch",
            ts=T0 + 9,
            ttft_s=5.0,
            e2e_s=9.0,
            deadline_ts=T0 + 100,
            output_tokens=200,
        ),
    ]


def test_summary_on_a_hand_made_run(client: Client, sink: FeedbackSink) -> None:
    run = hand_made_run()
    request = InferenceRequest(ts=T0, request_id="i1", model="llama3-8b", input_tokens=100, output_budget=128)
    rejected = InferenceRequest(
        ts=T0 + 10, request_id="r1", model="llama3-8b", slo_class="interactive", input_tokens=100,
        output_budget=128,
    )  # fmt: skip
    routing = RoutingDecision(
        request_id="i1", model="llama3-8b", slo_class="interactive", dc="dc1", instance_id="i0",
        policy="round-robin", decision_latency_s=0.0002, request=request,
    )  # fmt: skip
    admission = AdmissionDecision(
        request_id="i1", model="llama3-8b", slo_class="interactive", action="admit", policy="pass"
    )
    assert sink.write_completions(run + run[:2]) == 7
    assert sink.write_requests([request, request, rejected]) == 2
    assert sink.write_routing([routing]) == 1
    assert sink.write_admission([admission]) == 1
    assert sink.write_routing([routing]) == 0

    result = summary(client)
    assert result["window_s"] == 10.0
    assert result["clickhouse_rows"] == 11
    per_class = cast(dict[str, dict[str, Any]], result["per_class"])
    assert per_class["interactive"] == {
        "requests": 6,  # r1 too: it never completed
        "completions": 6,
        "completed": 4,
        "aborted": 0,  # i2's retry finished ok: a request's last attempt decides
        "timeout": 1,
        "error": 0,
        "ttft_p50_s": 2.6,  # of 0.5, 0.75, 2.6, 3.0, inf, inf
        "ttft_p95_s": None,  # lands on i4 or r1, which never got a first token
        "output_tokens_per_s": 19.3,  # 100 + 50 + 30 + 13 (i5's inside W)
        "goodput_tokens_per_s": 10.0,  # i1 (i5 met its objective after W's end)
        "compliant_share": 0.518135,
    }
    assert per_class["batch"]["goodput_tokens_per_s"] == 20.0
    assert per_class["batch"]["ttft_p95_s"] == 5.0
    total = cast(dict[str, Any], result["total"])
    assert (total["requests"], total["completions"], total["completed"]) == (7, 7, 5)
    assert total["ttft_p50_s"] == 3.0  # of 0.5, 0.75, 2.6, 3.0, 5.0, inf, inf
    assert total["goodput_tokens_per_s"] == 30.0 and total["compliant_share"] == 0.763359

    # Requests first arriving in [T0+2, T0+9): i3, i4, i5; W = T0+2 .. T0+8 (i5's first token
    # comes after it).
    later = summary(client, since_ts=T0 + 2, until_ts=T0 + 9)
    assert later["window_s"] == 6.0 and list(cast(dict[str, Any], later["per_class"])) == ["interactive"]
    assert cast(dict[str, Any], later["total"])["requests"] == 3
    assert cast(dict[str, Any], later["total"])["output_tokens_per_s"] == 5.0  # i3's 30 tokens
    # One request (i5) arrived in [T0+8, T0+9): W runs from it to the end of its last attempt.
    alone = summary(client, since_ts=T0 + 8, until_ts=T0 + 9)
    assert alone["window_s"] == 5.75
    assert cast(dict[str, Any], alone["total"])["goodput_tokens_per_s"] == round(51 / 5.75, 6)
    rollup = "SELECT sum(good_tokens), sum(output_tokens) FROM goodput_per_minute"
    assert client.query(rollup).result_rows[0] == (401, 431)  # met_slo as the sink judged each attempt


def test_summary_of_an_empty_store(client: Client) -> None:
    nothing = {
        "gpu_seconds_busy": 0.0,
        "gpu_seconds_idle": 0.0,
        "wasted_gpu_seconds": 0.0,
        "cost": 0.0,
        "cost_per_million_goodput_tokens": None,
    }
    assert summary(client) == {
        "window_s": 0.0, "clickhouse_rows": 0, "total": {}, "per_class": {}, "cost": nothing
    }  # fmt: skip


class FlakyInserts:
    """The real client, whose first insert fails: before writing, or after (the answer lost)."""

    def __init__(self, client: Client, store_then_fail: bool) -> None:
        self._client = client
        self._store_then_fail = store_then_fail
        self.failures = 0

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures == 0 and args[0] == "completions":
            self.failures += 1
            if self._store_then_fail:
                self._client.insert(*args, **kwargs)
            raise OperationalError("connection reset")
        return self._client.insert(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.mark.parametrize("store_then_fail", [False, True])
def test_retried_insert_writes_once(client: Client, store_then_fail: bool) -> None:
    flaky = FlakyInserts(client, store_then_fail)
    sink = FeedbackSink(cast(Client, flaky), DEFAULT_SLO_CLASSES, retry_for_s=5.0)
    written = sink.write_completions([completion("r1")])
    assert flaky.failures == 1
    assert written == (0 if store_then_fail else 1)  # the retry found it already stored
    assert scalar(client, "SELECT count() FROM completions") == 1
    assert scalar(client, "SELECT sum(completions) FROM goodput_per_minute") == 1


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated store the CLI opens (its client closed: the CLI opens its own)."""
    url = f"chdb:///{tmp_path / 'clickhouse'}"
    with connect(url) as opened:
        migrate(opened)
    monkeypatch.setenv("TOKENFLEET_CLICKHOUSE_DSN", url)
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    return url


def tables_of(url: str) -> set[str]:
    with connect(url) as opened:
        return {row[0] for row in opened.query("SHOW TABLES").result_rows}


def sql_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    from cli.main import main

    assert main(["sql", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("tokenfleet sql: error: ")
    return err


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("DROP TABLE requests", "DROP statements are refused"),
        ("TRUNCATE TABLE completions", "TRUNCATE statements are refused"),
        ("INSERT INTO slo_classes (name) VALUES ('x')", "INSERT statements are refused"),
        ("ALTER TABLE requests DELETE WHERE 1", "ALTER statements are refused"),
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file() is refused"),
        ("SELECT * FROM \"file\"('/etc/passwd', 'LineAsString')", "file() is refused"),
        ("SELECT file('/etc/passwd')", "file() is refused"),
        ("SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString')", "url() is refused"),
        ("SELECT * FROM s3('http://127.0.0.1:9/b/k', 'CSV')", "s3() is refused"),
        ("SELECT * FROM remote('127.0.0.1:9', system.one)", "remote() is refused"),
        ("SELECT 1 INTO OUTFILE '/tmp/tokenfleet-outfile.txt'", "INTO OUTFILE is refused"),
        ("SELECT 1; DROP TABLE requests", "one statement at a time"),
        ("SELECT 1 SETTINGS readonly = 0", "READONLY"),
        ("SELECT number FROM numbers(100) SETTINGS max_result_rows = 0", "READONLY"),
        ("SELECT nope FROM requests", "UNKNOWN_IDENTIFIER"),
    ],
)
def test_sql_is_read_only_by_default(
    store: str, capsys: pytest.CaptureFixture[str], query: str, expected: str
) -> None:
    assert expected in sql_error(capsys, [query])
    assert {"requests", "completions", "slo_classes"} <= tables_of(store)
    with connect(store) as opened:
        assert scalar(opened, "SELECT count() FROM slo_classes") == 0


def test_sql_reads_within_a_row_and_a_time_limit(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["sql", "SELECT number FROM numbers(3) -- DROP TABLE requests; file('x')"]) == 0
    assert capsys.readouterr().out == "number\n0\n1\n2\n"
    assert main(["sql", "SELECT 'url(' AS s"]) == 0  # a string literal calls nothing
    assert capsys.readouterr().out == "s\nurl(\n"
    assert "TOO_MANY_ROWS" in sql_error(capsys, ["--max-rows", "10", "SELECT number FROM numbers(20)"])
    err = sql_error(capsys, ["--timeout", "0.5", "SELECT count() FROM numbers(100000000000000)"])
    assert "TIMEOUT_EXCEEDED" in err or "Timeout exceeded" in err


def test_the_engine_itself_refuses_writes_with_the_sql_settings(store: str) -> None:
    """readonly=1 holds even for a statement the text check would have refused first."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import query_settings

    for statement in ("DROP TABLE requests", "SELECT * FROM file('/etc/passwd', 'LineAsString')"):
        with connect(store) as opened, pytest.raises(ClickHouseError, match="READONLY"):
            opened.query(statement, settings=query_settings(10, 5.0))
    assert "requests" in tables_of(store)


def test_a_store_the_running_worker_holds_is_one_line_not_the_engines_error(
    store: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Another process with the embedded engine open (as the worker of ``tokenfleet up``): the
    store's commands say so in one line, and the engine's own lock error never reaches stderr."""
    import subprocess
    import sys

    from cli.main import main

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from infra.clickhouse import connect; "
         f"c = connect({store!r}); print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        for args in (["sql", "SELECT 1"], ["slomax", "status"], ["db", "migrate"]):
            assert main(args) == 2
            err = capfd.readouterr().err
            assert err.count("\n") == 1 and "Code: 76" not in err and "Cannot lock" not in err, err
            assert "is held by a running process" in err and "tokenfleet down" in err, err
    finally:
        holder.communicate("", timeout=60)
    assert main(["sql", "SELECT 1"]) == 0  # free again


def test_sql_write_changes_the_store(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["sql", "--write", "INSERT INTO slo_classes (name, deadline) VALUES ('x', 0)"]) == 0
    with connect(store) as opened:
        assert scalar(opened, "SELECT count() FROM slo_classes") == 1


def test_migrate_repairs_dropped_tables_and_their_columns(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    with connect(store) as opened:
        opened.command("DROP TABLE requests")
        opened.command("DROP TABLE goodput_per_minute")
    assert main(["db", "migrate"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "0001_create_requests (repaired: missing requests)",
        "0006_create_goodput_per_minute (repaired: missing goodput_per_minute)",
        "0008_add_admission_pool_and_home_dc (repaired: missing requests.home_dc)",
        "0011_add_run_columns (repaired: missing requests.run_id, requests.run_policy)",
        "0017_add_request_replay_columns"
        " (repaired: missing requests.prompt_block_hashes, requests.model_version)",
        "0018_requests_session (repaired: missing requests.session_id)",
    ]
    with connect(store) as opened:
        columns = {row[0] for row in opened.query("DESCRIBE TABLE requests").result_rows}
        assert "home_dc" in columns
        # The view (not dropped) feeds the re-created roll-up again.
        FeedbackSink(opened, DEFAULT_SLO_CLASSES, retry_for_s=5.0).write_completions([completion("r1")])
        assert scalar(opened, "SELECT sum(completions) FROM goodput_per_minute") == 1
        versions = opened.query("SELECT count() FROM schema_migrations FINAL").result_rows[0][0]
        assert versions == len(load_migrations())  # a repair records nothing new
    assert main(["db", "migrate"]) == 0
    assert capsys.readouterr().out == "database is up to date\n"


def test_a_request_row_carries_its_session_and_an_old_row_reads_none(
    client: Client, sink: FeedbackSink
) -> None:
    def request(rid: str, **fields: Any) -> InferenceRequest:
        return InferenceRequest(
            ts=T0, request_id=rid, model="llama3-8b", input_tokens=10, output_budget=8, **fields
        )

    assert sink.write_requests([request("s1", session_id="9f86d081884c7d65"), request("s2")]) == 2
    # A row written before the column existed: the insert names none of the newer columns.
    client.insert("requests", [["old", "s3"]], column_names=["event_id", "request_id"])
    rows = client.query("SELECT request_id, session_id FROM requests FINAL ORDER BY request_id")
    assert rows.result_rows == [("s1", "9f86d081884c7d65"), ("s2", ""), ("s3", "")]


def test_a_routing_row_names_its_prefill_instance_and_a_plan_its_prefill_replicas(
    client: Client, sink: FeedbackSink
) -> None:
    request = InferenceRequest(ts=T0, request_id="p1", model="llama3-8b", input_tokens=10, output_budget=8)
    decided = {"model": "llama3-8b", "slo_class": "interactive", "dc": "A", "policy": "tokenpilot",
               "decision_latency_s": 0.001}  # fmt: skip
    paired = RoutingDecision(
        request_id="p1", instance_id="d", prefill_instance_id="p", request=request, **decided
    )
    whole = RoutingDecision(request_id="p2", instance_id="d", request=request, **decided)
    assert sink.write_routing([paired, whole]) == 2
    rows = client.query(
        "SELECT request_id, prefill_instance_id FROM routing_decisions FINAL ORDER BY request_id"
    )
    assert rows.result_rows == [("p1", "p"), ("p2", "")]
    plans = [
        ReplicaPlan(planner="fleetmind", model="llama3-8b", dc="A", replicas=3, prefill_replicas=1),
        ReplicaPlan(planner="fleetmind", model="llama3-8b", dc="B", replicas=2),
    ]
    assert sink.write_plans(plans) == 2
    rows = client.query("SELECT dc, prefill_replicas FROM replica_plans FINAL ORDER BY dc")
    assert rows.result_rows == [("A", 1), ("B", None)]


def test_migrate_repairs_in_library_use_too(tmp_path: Path) -> None:
    with connect(f"chdb:///{tmp_path / 'clickhouse'}") as opened:
        migrate(opened)
        opened.command("ALTER TABLE admission_decisions DROP COLUMN queue_pool")
        assert migrate(opened) == [
            "0008_add_admission_pool_and_home_dc (repaired: missing admission_decisions.queue_pool)"
        ]
        assert migrate(opened) == []


def test_rows_carry_their_run_and_the_summary_reads_one_run(client: Client) -> None:
    first = FeedbackSink(
        client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-a", run_policy="round-robin"
    )
    second = FeedbackSink(
        client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-b", run_policy="slomax+tokenpilot"
    )
    first.write_completions([completion("a1"), completion("a2")])
    second.write_completions([completion("b1", output_tokens=10)])
    rows = client.query("SELECT request_id, run_id, run_policy FROM completions FINAL ORDER BY request_id")
    assert rows.result_rows == [
        ("a1", "run-a", "round-robin"),
        ("a2", "run-a", "round-robin"),
        ("b1", "run-b", "slomax+tokenpilot"),
    ]

    def completions(run_id: str) -> object:
        return cast(dict[str, Any], summary(client, run_id=run_id)["total"])["completions"]

    assert (completions("run-a"), completions("run-b"), completions("")) == (2, 1, 3)
    assert clickhouse_rows(client, "run-b") == 1


def test_summary_counts_rejected_and_held_requests_with_their_top_reasons(
    client: Client, sink: FeedbackSink
) -> None:
    def answer(rid: str, action: str, reason: str) -> AdmissionDecision:
        return AdmissionDecision(
            request_id=rid, model="llama3-8b", slo_class="interactive", action=action, reason=reason,
            policy="slomax+tokenpilot",
        )  # fmt: skip

    run = hand_made_run()
    assert sink.write_completions(run) == len(run)
    decisions = [
        answer("h1", "queue", "slomax: predicted TTFT 1.42 s over 1.30 s (headroom and margin)"),
        answer("h1", "reject", "expired: waited 1.9 s + predicted TTFT 0.4 s > 2 s objective"),
        answer("h2", "queue", "slomax: predicted TTFT 1.61 s over 1.25 s (headroom and margin)"),
        answer("h3", "queue", "slomax: no instance has prefill room"),
        answer("r1", "reject", "cannot_meet_slo: waited 0.0 s + predicted TTFT 9 s > 2 s objective"),
        answer("a1", "admit", "slomax: interactive within headroom"),
    ]
    assert sink.write_admission(decisions) == len(decisions)
    result = summary(client)
    interactive = cast(dict[str, dict[str, Any]], result["per_class"])["interactive"]
    assert (interactive["rejected"], interactive["held"]) == (2, 3)
    assert interactive["rejects_by_reason"] == {"cannot_meet_slo": 1, "expired": 1}
    assert interactive["holds_by_reason"] == {
        # one cause, each number its range over the holds of that cause
        "predicted TTFT 1.42 to 1.61 s over 1.25 to 1.30 s (headroom and margin)": 2,
        "no instance has prefill room": 1,
    }
    total = cast(dict[str, Any], result["total"])
    assert (total["rejected"], total["held"]) == (2, 3)


# -- cost per minute -----------------------------------------------------------------------------


def beat(instance_id: str, ts: float, running: int, price: float | None = 3.0, gpus: int = 1) -> Heartbeat:
    return Heartbeat(
        ts=ts,
        instance_id=instance_id,
        dc="eu",
        model="llama3-8b",
        model_version="v1",
        waiting=0,
        running=running,
        tokens_in_flight=0,
        kv_blocks_used=0,
        kv_blocks_total=100,
        gpus=gpus,
        price_per_hour=price,
    )


def cost_rows(client: Client) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    rows = client.query(
        "SELECT tenant, slo_class, sum(gpu_seconds), sum(wasted_gpu_seconds), sum(cost), "
        "sum(goodput_tokens) FROM cost_per_minute GROUP BY tenant, slo_class"
    ).result_rows
    return {(r[0], r[1]): (r[2], r[3], r[4], r[5]) for r in rows}


def test_cost_per_minute_splits_busy_time_by_tokens_and_reports_idle_apart(client: Client) -> None:
    """Two requests on one 2-GPU instance in one minute: 40 beats of 0.25 s, 30 of them busy
    (7.5 s x 2 GPUs = 15 busy GPU-s, 5 idle), at $6/hour. Request a (tenant t1) processed 300
    tokens and met its objective; b (t2) 100 tokens and timed out: a gets 3/4 of the busy time,
    b 1/4, all of it wasted."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, heartbeat_interval_s=0.25)
    minute = 1_700_000_040.0  # a minute boundary
    sink.write_heartbeats(
        [beat("i0", minute + k * 0.25, running=int(k < 30), price=6.0, gpus=2) for k in range(40)]
    )
    sink.write_completions(
        [
            completion(
                "a", tenant="t1", ts=minute + 5, input_tokens=250, cached_tokens=50, output_tokens=100
            ),
            completion("b", tenant="t2", ts=minute + 6, status="timeout", input_tokens=100, output_tokens=0),
        ]
    )
    rows = cost_rows(client)
    busy_a, wasted_a, cost_a, good_a = rows[("t1", "interactive")]
    busy_b, wasted_b, cost_b, good_b = rows[("t2", "interactive")]
    assert busy_a == pytest.approx(15.0 * 3 / 4) and wasted_a == 0 and good_a == 100
    assert busy_b == pytest.approx(15.0 / 4) and wasted_b == pytest.approx(busy_b) and good_b == 0
    busy_cost = 30 * 0.25 * 6.0 / 3600
    assert cost_a + cost_b == pytest.approx(busy_cost) and cost_a == pytest.approx(3 * cost_b)
    idle, _, idle_cost, _ = rows[("", "(idle)")]
    assert idle == pytest.approx(10 * 0.25 * 2) and idle_cost == pytest.approx(10 * 0.25 * 6.0 / 3600)
    assert ("", "(unattributed)") not in rows
    whole = costs(client)  # the fleet's whole cost, idle included, per compliant token
    assert whole["cost"] == pytest.approx(40 * 0.25 * 6.0 / 3600, abs=1e-6)
    assert whole["cost_per_million_goodput_tokens"] == pytest.approx(whole["cost"] / 100 * 1e6, rel=1e-3)
    assert whole["gpu_seconds_busy"] == 15.0 and whole["gpu_seconds_idle"] == 5.0


def test_cost_per_minute_keeps_busy_time_with_no_ended_attempt_and_unpriced_instances(client: Client) -> None:
    """An instance busy for a minute in which nothing ended on it: its busy time is
    '(unattributed)', not lost; an instance without a price reports GPU-seconds at cost 0; the
    attributed, unattributed and idle GPU-seconds add up to the fleet's."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, heartbeat_interval_s=0.25)
    minute = 1_700_000_040.0
    sink.write_heartbeats([beat("busy", minute + k * 0.25, running=1, price=None) for k in range(8)])
    sink.write_heartbeats([beat("i1", minute + k * 0.25, running=int(k < 4)) for k in range(8)])
    sink.write_completions([completion("c", instance_id="i1", ts=minute + 1.5)])
    rows = cost_rows(client)
    assert rows[("", "(unattributed)")][0] == pytest.approx(2.0) and rows[("", "(unattributed)")][2] == 0
    assert rows[("default", "interactive")][0] == pytest.approx(1.0)
    total = sum(r[0] for r in rows.values())
    fleet = scalar(client, "SELECT sum(gpu_seconds) FROM instance_minutes")
    assert total == pytest.approx(fleet, rel=1e-3) and fleet == pytest.approx(4.0)


def test_a_fleet_without_prices_reports_gpu_seconds_and_no_cost_per_token(client: Client) -> None:
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, heartbeat_interval_s=0.25)
    minute = 1_700_000_040.0
    sink.write_heartbeats([beat("i0", minute + k * 0.25, running=1, price=None) for k in range(8)])
    sink.write_completions([completion("c", ts=minute + 1.0)])
    whole = costs(client)
    assert whole["gpu_seconds_busy"] == 2.0 and whole["cost"] == 0.0
    assert whole["cost_per_million_goodput_tokens"] is None
