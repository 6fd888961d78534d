"""Closed-loop sessions in the simulator: a call waits for its session's previous answer, a
session lasts as long as it did in the recording, more calls when answers come sooner."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.engine.attempt import Attempt
from sim.engine.profiles import PROFILES
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.loop.sessions import Sessions
from sim.workloads.trace import load_workload
from tests.unit.sim.helpers import fleet_of, request, workload

pytestmark = pytest.mark.unit


def user(name: str, times: list[float], think_s: float = 0.5, prompt: int = 1024, output: int = 20):  # type: ignore[no-untyped-def]
    """A session's calls at ``times``; every call but the first waits ``think_s`` after the one before."""
    return [
        request(f"{name}-{k}", at, prompt, output, session_id=name, think_s=None if k == 0 else think_s)
        for k, at in enumerate(times)
    ]


def test_a_closed_loop_call_waits_for_its_predecessor_and_its_think_time() -> None:
    calls = user("u", [0.0, 10.0, 20.0])
    sessions = Sessions.of(tuple(calls))
    assert [r.request_id for r in sessions.first] == ["u-0"] and sessions.held == 2
    following = sessions.ended(calls[0], 1.25)
    assert following is not None and following[0].request_id == "u-1" and following[1] == 1.75
    assert following[0].arrival_s == 1.75 and sessions.held == 1


def test_calls_past_the_session_s_recorded_span_are_dropped_and_a_faster_session_repeats() -> None:
    calls = user("u", [0.0, 10.0, 20.0])  # until = 20 + 10 / 2 = 25 s
    slow = Sessions.of(tuple(calls))
    assert slow.ended(calls[0], 24.9) is None  # u-1 would come at 25.4 s: the session is over
    assert slow.held == 0
    fast = Sessions.of(tuple(calls))
    sent = [fast.ended(calls[0], 1.0)]
    assert sent[0] is not None
    sent.append(fast.ended(sent[0][0], 2.0))
    assert sent[1] is not None and sent[1][0].request_id == "u-2"
    repeat = fast.ended(sent[1][0], 3.0)  # its recorded calls ran out: it repeats the last one
    assert repeat is not None and repeat[0].request_id == "u-2~1" and repeat[1] == 3.5
    assert repeat[0].block_hashes == calls[2].block_hashes
    again = fast.ended(repeat[0], 4.0)
    assert again is not None and again[0].request_id == "u-2~2"


def test_open_loop_calls_and_requests_without_a_session_go_at_their_own_time() -> None:
    open_loop = request("u-2", 6.0, 1024, 20, session_id="u")
    calls = [*user("u", [0.0, 5.0]), open_loop, request("x", 3.0, 1024, 20)]
    sessions = Sessions.of(tuple(calls))
    assert [r.request_id for r in sessions.first] == ["u-0", "x", "u-2"]
    assert sessions.ended(calls[3], 4.0) is None


def test_the_simulator_sends_a_session_s_calls_one_after_the_other_and_more_on_a_faster_fleet() -> None:
    calls = [*user("a", [0.0, 2.0, 4.0, 6.0, 8.0], think_s=0.2), *user("b", [0.1, 2.1, 4.1, 6.1, 8.1], 0.2)]
    runs = {}
    for name, profile in (("nominal", PROFILES["llama3-8b-h100"]), ("slow", PROFILES["llama3-8b-h100"])):
        if name == "slow":
            profile = replace(profile, t0_s=profile.t0_s * 40, decode_s_per_seq=profile.decode_s_per_seq * 40)
        runs[name] = simulate(workload(*calls), fleet_of(1, profile), "round-robin", SimConfig())
    for run in runs.values():
        by_session: dict[str, list[Attempt]] = {}
        for attempt in sorted(run.attempts, key=lambda a: a.arrival_s):
            by_session.setdefault(attempt.request.session_id, []).append(attempt)
        for attempts in by_session.values():
            for before, after in itertools.pairwise(attempts):
                assert before.end_s is not None
                assert after.arrival_s == pytest.approx(before.end_s + before.return_s + 0.2)
    counts = {name: len(run.attempts) for name, run in runs.items()}
    assert counts["nominal"] > len(calls) > counts["slow"], counts


def test_a_trace_carries_session_and_think_time_and_rejects_a_negative_one(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "session_id": "u"},
        {"timestamp": 900, "input_length": 600, "output_length": 5, "session_id": "u", "think_s": 0.25},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_workload(path)
    assert [(r.session_id, r.think_s) for r in loaded.requests] == [("u", None), ("u", 0.25)]
    assert loaded.scaled(2.0).requests[1].think_s == 0.125
    rows[1]["think_s"] = -1
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match="think_s"):
        load_workload(path)
