"""The fault suite's pure counting helpers (the scenarios themselves run with ``make faults``)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.faults import INJECT_DIR, format_table
from lab.faults.clients import BrokerLog, Collector, Decided, Publisher
from lab.faults.harness import Run
from lab.faults.messages import fuzzed_messages, poison_pills
from lab.faults.stress import Stress
from lab.faults.tally import (
    count_lost,
    missing_digests,
    once_and_twice,
    p99,
    recovered_after,
    tally,
    window_latencies,
)
from schemas.codec import DecodeError, decode
from schemas.events import InferenceRequest


def test_decided_once_and_twice_count_valid_keys_only() -> None:
    valid = [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    seen = tally([("a", 1), ("b", 1), ("b", 1), ("b", 1), ("x", 1), ("x", 1), ("c", 2)])
    # a once; b three times (counts as twice); c decided only as attempt 2 (another key); d never
    assert once_and_twice(valid, seen) == (1, 1)
    assert once_and_twice([], seen) == (0, 0)
    assert once_and_twice([("a", 1), ("a", 1)], seen) == (1, 0)  # a key published twice counts once


def test_lost_means_neither_decided_nor_rejected() -> None:
    valid = [("a", 1), ("b", 1), ("c", 1), ("c", 2)]
    assert count_lost(valid, decided=[("a", 1)], rejected=[("b", 1)]) == 2
    assert count_lost(valid, decided=[("a", 1), ("c", 1), ("c", 2)], rejected=[("b", 1)]) == 0
    assert count_lost([], decided=[], rejected=[]) == 0


def test_p99_is_nearest_rank_and_none_when_empty() -> None:
    assert p99([]) is None
    assert p99([float("nan")]) is None
    assert p99([0.5]) == 0.5
    values = [i / 100 for i in range(1, 101)]  # 0.01 .. 1.00
    assert p99(values) == pytest.approx(0.99)
    assert p99([*values, float("nan")]) == pytest.approx(0.99)


def test_window_latencies_and_recovery() -> None:
    published = {("a", 1): 10.0, ("b", 1): 11.0, ("c", 1): 20.0, ("d", 1): 12.0}
    decided = {("a", 1): 10.5, ("b", 1): 13.0, ("c", 1): 20.1}  # d never decided
    assert sorted(window_latencies(published, decided, 10.0, 12.0)) == [0.5, 2.0]
    assert recovered_after(12.0, decided.values()) == pytest.approx(1.0)
    assert recovered_after(30.0, decided.values()) is None
    assert recovered_after(13.0, [13.0]) is None  # strictly after the end


def test_missing_digests_match_dead_letters_by_sha256() -> None:
    bad = [b"x", b"y", b"z"]
    letters = [hashlib.sha256(b"x").hexdigest(), hashlib.sha256(b"z").hexdigest()]
    assert missing_digests(bad, letters) == 1


def test_fuzzed_messages_and_pills_never_decode_and_are_seeded() -> None:
    messages = fuzzed_messages(300, seed=3)
    assert messages == fuzzed_messages(300, seed=3)
    for raw in [*messages, *poison_pills(random.Random(0)).values()]:
        with pytest.raises(DecodeError):
            decode(InferenceRequest, raw)


def test_table_shows_every_scenario_with_dashes_for_null() -> None:
    table = format_table(
        {
            "baseline": {"published": 5, "routing_p99_s": 0.0123, "recovered_s": None},
            "store_down_mid_run": {"published": None, "note": "not run"},
        }
    )
    lines = table.splitlines()
    assert len(lines) == 4
    assert "0.012" in lines[2] and " - " in lines[2]
    assert "not run" in lines[3]


def _broker_restart_run(tmp_path: Path) -> Run:
    """A broker_restart run's records, made by hand: the broker stopped at t=100."""
    run = Run("broker_restart", tmp_path)
    run.publisher, run.collector = Publisher(""), Collector("")
    run.broker_stopped_at = 100.0
    acked = {
        "old-lost": 90.0,
        "old-ok": 95.0,
        "new-lost": 110.0,
        "new-unserved": 111.0,
        "new-ok": 112.0,
        "new-dropped": 112.5,
    }
    for rid, at in acked.items():
        run.publisher.valid[(rid, 1)] = at
        run.publisher.acked_at[(rid, 1)] = at
    run.collector.decisions = [
        Decided(("old-ok", 1), 96.0, "w", "d1"),
        Decided(("new-ok", 1), 113.0, "w", "d2"),
        Decided(("new-dropped", 1), 114.0, "w", "d3"),  # its decision record is not served at the end
    ]
    run.collector.completions = [(("old-ok", 1), "c-old-stored", "ok"), (("warm", 1), "c-old-gone", "ok")]
    run.collector.completions_before_restart = 2
    run.collector.completions.append((("new-ok", 1), "c-new-unserved", "ok"))
    run.collector.completions.append((("new-ok", 2), "c-new-collided", "ok"))
    run.collector.completions.append((("new-ok", 3), "c-new-not-stored", "ok"))
    run.served = BrokerLog(
        request_keys={("new-lost", 1), ("new-ok", 1), ("new-dropped", 1)},
        decision_keys={("new-ok", 1)},
        completion_ids={"c-new-collided", "c-new-not-stored"},
        collisions=3,
        collided_completion_ids={"c-new-collided"},
    )
    return run


def test_broker_audit_separates_what_the_broker_lost_from_what_the_system_lost(tmp_path: Path) -> None:
    run = _broker_restart_run(tmp_path)
    figures = run.figures()
    # Only "new-lost" is in the log the new broker serves and was never decided: the system's loss.
    assert figures["lost"] == 1
    assert figures["lost_with_broker_log"] == 1  # "old-lost": acknowledged by the old broker
    assert figures["lost_unserved_by_new_broker"] == 1  # "new-unserved": acked, never served
    assert figures["broker_offset_collisions"] == 3
    assert figures["decided_not_executed"] == 1  # new-dropped: the fleet never got its decision
    assert figures["decided_not_executed_unserved_by_new_broker"] == 1
    missing = run.missing_completions({"c-old-stored"})
    assert missing == {
        "completions_missing": 1,  # c-new-not-stored: served by the new broker, never stored
        "completions_missing_with_broker_log": 1,  # c-old-gone: only the old log had it
        "completions_missing_unserved_by_new_broker": 1,  # c-new-unserved
        "completions_missing_at_broker_collisions": 1,  # c-new-collided: a live reader skips it
        "completions_missing_with_broker_losses": 4,
    }


def test_without_a_broker_restart_every_lost_request_counts(tmp_path: Path) -> None:
    run = _broker_restart_run(tmp_path)
    run.broker_stopped_at, run.served = None, None
    assert run.figures()["lost"] == 3  # old-lost, new-lost, new-unserved
    assert run.missing_completions({"c-old-stored"}) == {"completions_missing": 4}


def test_store_outage_injection_fails_every_store_call_while_its_file_exists(tmp_path: Path) -> None:
    """The fault suite's injected outage, in a fresh interpreter as the worker gets it."""
    flag = tmp_path / "down"
    code = (
        "import sys\n"
        "from infra.clickhouse.client import connect\n"
        "url = sys.argv[1]\n"
        "client = connect(url)\n"
        "assert client.command('SELECT 1') == 1\n"
        "open(sys.argv[2], 'w').close()\n"
        "calls = (lambda: client.command('SELECT 1'), lambda: client.query('SELECT 1'),\n"
        "         lambda: connect(url))\n"
        "for call in calls:\n"
        "    try:\n"
        "        call()\n"
        "    except Exception as exc:\n"
        "        assert type(exc).__name__ == 'OperationalError', exc\n"
        "    else:\n"
        "        raise AssertionError('a store call went through during the outage')\n"
        "import os; os.unlink(sys.argv[2])\n"
        "assert client.query('SELECT 2').result_rows == [(2,)]\n"
        "print('ok')\n"
    )
    repo = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": f"{INJECT_DIR}{os.pathsep}{repo}",
        "TOKENFLEET_FAULT_STORE_DOWN_FILE": str(flag),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, f"chdb:///{tmp_path / 'store'}", str(flag)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_handover_gaps_of_a_killed_decider() -> None:
    """Partition 0 is the survivor's (a 1.5 s pause at the kill); 1 the victim's, taken over
    4 s after the kill; the longest pause counts from 2 s before the kill."""
    from lab.faults.tally import handover_gaps, longest_pause

    kill = 100.0
    decisions = [
        Decided(("a", 1), 99.0, "s:1", "e1", 0),
        Decided(("b", 1), 100.5, "s:1", "e2", 0),
        Decided(("c", 1), 110.0, "s:1", "e3", 0),
        Decided(("d", 1), 99.5, "v:2", "e4", 1),
        Decided(("e", 1), 104.0, "s:1", "e5", 1),
        Decided(("z", 1), 80.0, "s:1", "e0", 1),  # partition 1 was the survivor's long before
    ]
    survivor, takeover = handover_gaps(decisions, kill, kill + 20.0, "s:1", "v:2")
    assert survivor == pytest.approx(10.0)  # 100.5 -> 110 on partition 0
    assert takeover == pytest.approx(4.0)
    assert longest_pause([1.0, 2.0], 0.0, 10.0) == pytest.approx(8.0)
    assert longest_pause([], 0.0, 3.0) == pytest.approx(3.0)


def test_stress_runs_its_burners_only_inside_the_block() -> None:
    with Stress(2) as stress:
        processes = list(stress.processes)
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
    assert all(p.returncode is not None for p in processes)  # killed and reaped
    for process in processes:
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)
    with Stress(0) as idle:
        assert idle.processes == []
    with pytest.raises(ValueError):
        Stress(-1)
