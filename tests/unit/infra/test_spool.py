"""The feedback spool alone: events on local disk, drained oldest first, bounded, quarantined."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.clickhouse.spool import Spool, SpoolBatch, SpoolLocked
from schemas.events import Completion, Event, InferenceRequest

T0 = 1_700_000_000.0


def req(request_id: str) -> InferenceRequest:
    # a fixed ts: every event of one id length encodes to the same length (the size-bound test)
    return InferenceRequest(request_id=request_id, model="m", input_tokens=10, output_budget=5, ts=T0)


def done(request_id: str) -> Completion:
    return Completion(
        request_id=request_id,
        instance_id="i0",
        model="m",
        status="ok",
        arrival_ts=1.0,
        input_tokens=1,
        output_tokens=1,
    )


def drain(spool: Spool, max_rows: int = 1000) -> list[tuple[str, Event]]:
    """Everything in the spool, batch by batch, each marked stored."""
    out: list[tuple[str, Event]] = []
    while (batch := spool.next_batch(max_rows)) is not None:
        out.extend((batch.table, e) for e in batch.events)
        spool.done(batch)
    return out


def segments(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("[0-9]*.jsonl"))


def test_appended_events_drain_oldest_first_and_their_files_go(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.append("requests", [req("a"), req("b")]) == 2
    assert spool.append("completions", [done("a")]) == 1
    assert spool.append("requests", [req("c")]) == 1  # the open requests segment
    assert spool.rows == 4 and spool.size_bytes > 0
    assert segments(tmp_path) == ["000000000000-requests.jsonl", "000000000001-completions.jsonl"]
    # JSON lines of the events as the codec writes them
    first = (tmp_path / "000000000000-requests.jsonl").read_bytes().splitlines()
    assert [InferenceRequest.model_validate_json(line).request_id for line in first] == ["a", "b", "c"]

    batch = spool.next_batch(2)
    assert batch is not None and batch.table == "requests"
    assert [getattr(e, "request_id", None) for e in batch.events] == ["a", "b"]
    # not done: the same batch again (a failed write is retried from where it stopped)
    again = spool.next_batch(2)
    assert again == batch
    spool.done(batch)
    assert spool.rows == 2
    # appends while a segment drains go to a new one, after it
    spool.append("requests", [req("d")])
    rest = drain(spool, max_rows=2)
    assert [(t, getattr(e, "request_id", None)) for t, e in rest] == [
        ("requests", "c"),
        ("completions", "a"),
        ("requests", "d"),
    ]
    assert spool.rows == 0 and spool.size_bytes == 0
    assert segments(tmp_path) == []
    assert spool.next_batch(10) is None
    spool.close()


def test_a_stale_batch_cannot_be_marked_done_twice(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("requests", [req("a"), req("b")])
    batch = spool.next_batch(1)
    assert batch is not None
    spool.done(batch)
    with pytest.raises(ValueError):
        spool.done(batch)
    with pytest.raises(ValueError):
        spool.done(SpoolBatch("requests", batch.events, seq=99, start=0))
    spool.close()


def test_a_restarted_spool_finds_and_drains_what_was_left(tmp_path: Path) -> None:
    segment_bytes = 3 * len(req("r0").model_dump_json())  # three events per segment
    spool = Spool(tmp_path, segment_bytes=segment_bytes)
    ids = [f"r{i}" for i in range(10)]
    for rid in ids:
        spool.append("requests", [req(rid)])
    spool.append("completions", [done("r0")])
    assert len(segments(tmp_path)) > 2
    batch = spool.next_batch(1)
    assert batch is not None
    spool.done(batch)  # r0 stored; its segment holds more rows, so it stays on disk
    spool.close()  # a stop (or a crash) before the rest was stored

    again = Spool(tmp_path, segment_bytes=segment_bytes)
    # the partly drained segment comes back whole: r0 is sent again (the sink skips it)
    assert again.rows == 11
    again.append("requests", [req("new")])  # a new segment, after the old ones
    drained = [getattr(e, "request_id", None) for _t, e in drain(again, max_rows=3)]
    assert drained[: len(ids)] == ids
    assert drained[len(ids) :] == ["r0", "new"]
    assert again.rows == 0 and segments(tmp_path) == []
    again.close()


def test_a_torn_last_line_is_quarantined_and_the_rest_drains(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("requests", [req("a"), req("b")])
    spool.close()
    (path,) = tmp_path.glob("0*-requests.jsonl")
    with path.open("ab") as out:
        out.write(b'{"event_id": "half')  # the crash came mid-write
    again = Spool(tmp_path)
    assert again.rows == 3  # counted as lines until read
    assert [getattr(e, "request_id", None) for _t, e in drain(again)] == ["a", "b"]
    assert again.rows == 0
    (line,) = again.rejected_path("requests").read_text().splitlines()
    record = json.loads(line)
    assert record["error"].startswith("undecodable spool line: invalid JSON") and record["line"].startswith(
        '{"event_id": "half'
    )
    again.close()


def test_the_size_bound_keeps_the_oldest_rows_and_counts_the_dropped(tmp_path: Path) -> None:
    one = len(req("r00").model_dump_json()) + 1
    spool = Spool(tmp_path, max_bytes=5 * one)
    assert spool.append("requests", [req(f"r{i:02d}") for i in range(3)]) == 3
    assert spool.append("requests", [req(f"r{i:02d}") for i in range(3, 8)]) == 2  # room for 2
    assert spool.append("requests", [req("r99")]) == 0
    stats = spool.stats()
    assert stats.dropped_rows == 4 and stats.dropped_by_table == {"requests": 4}
    assert spool.size_bytes <= spool.max_bytes
    assert [getattr(e, "request_id", None) for _t, e in drain(spool)] == [f"r{i:02d}" for i in range(5)]
    assert spool.append("requests", [req("after")]) == 1  # drained: room again
    spool.close()


def test_rejected_batches_are_quarantined_with_the_error_and_never_drained(tmp_path: Path) -> None:
    counted: list[tuple[str, int]] = []
    spool = Spool(tmp_path, on_rejected=lambda table, rows: counted.append((table, rows)))
    spool.append("requests", [req("bad"), req("good")])
    batch = spool.next_batch(1)
    assert batch is not None
    spool.reject(batch, "DataError: attempt out of range")
    assert spool.reject_events("completions", [done("x")], "ProgrammingError: no such column") == 1
    assert [getattr(e, "request_id", None) for _t, e in drain(spool)] == ["good"]
    (line,) = spool.rejected_path("requests").read_text().splitlines()
    record = json.loads(line)
    assert record["table"] == "requests" and record["error"] == "DataError: attempt out of range"
    assert InferenceRequest.model_validate(record["event"]).request_id == "bad"
    assert spool.stats().rejected_rows == 2
    assert counted == [("requests", 1), ("completions", 1)]  # the feedback store's metric
    spool.close()
    # a restart does not drain the quarantine
    again = Spool(tmp_path)
    assert again.rows == 0 and again.next_batch(10) is None
    assert again.rejected_path("completions").exists()
    again.close()


def test_the_rejected_quarantine_is_bounded(tmp_path: Path) -> None:
    bound = 3 * (len(req("r0").model_dump_json()) + 100)
    spool = Spool(tmp_path, rejected_max_bytes=bound)
    kept = spool.reject_events("requests", [req(f"r{i}") for i in range(5)], "DataError")
    assert 0 < kept < 5
    assert spool.stats().rejected_dropped_rows == 5 - kept
    assert spool.rejected_path("requests").stat().st_size <= bound
    spool.close()


def test_one_process_owns_a_spool_directory(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(SpoolLocked):
        Spool(tmp_path)
    spool.close()
    spool.close()  # idempotent
    with pytest.raises(RuntimeError):
        spool.append("requests", [req("late")])
    Spool(tmp_path).close()  # released


def test_unknown_tables_are_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(ValueError):
        spool.append("kv_events", [req("a")])
    spool.close()
