"""The dispatcher's ledger: the commit waits for the oldest open attempt; answers are kept."""

from __future__ import annotations

from dispatcher.ledger import Ledger
from schemas.events import Completion, Response


def completion(request_id: str) -> Completion:
    return Completion(
        request_id=request_id, instance_id="i", model="m", status="ok", arrival_ts=1.0,
        input_tokens=10, output_tokens=5,
    )  # fmt: skip


def response(request_id: str, text: str = "hi") -> Response:
    return Response(request_id=request_id, instance_id="i", model="m", status="ok", text=text)


def test_the_commit_stops_at_the_oldest_attempt_whose_end_was_not_delivered() -> None:
    ledger = Ledger()
    for offset, request_id in enumerate(["a", "b", "c"]):
        ledger.started(request_id, 1, "p0", offset)
    ledger.read("p0", 3)
    ledger.read("p1", 7)  # a partition with nothing open
    assert ledger.to_commit(["p0", "p1"]) == {"p0": 0, "p1": 7}
    ledger.delivered([response("b"), completion("b")])  # b ended; a still open
    assert ledger.to_commit(["p0", "p1"]) == {}  # nothing moved
    ledger.delivered([response("a"), completion("a")])
    assert ledger.to_commit(["p0", "p1"]) == {"p0": 2}
    ledger.delivered([completion("c")])
    assert ledger.to_commit(["p0"]) == {"p0": 3}
    assert ledger.open_attempts == 0


def test_answers_are_kept_newest_first_and_bounded() -> None:
    ledger = Ledger(kept=2)
    ledger.delivered([response("a"), response("b"), response("c")])
    assert ledger.answer("a", 1) is None
    answer = ledger.answer("c", 1)
    assert answer is not None and answer.text == "hi"
    assert ledger.answer("c", 2) is None  # another attempt has its own answer


def test_a_lost_log_holds_the_commit_of_what_is_open_at_zero() -> None:
    ledger = Ledger()
    ledger.started("a", 1, "p0", 40)
    ledger.read("p0", 41)
    assert ledger.to_commit(["p0"]) == {"p0": 40}
    ledger.log_lost(["p0"])
    ledger.read("p0", 5)  # the new log, read from its start
    assert ledger.to_commit(["p0"]) == {"p0": 0}
    ledger.delivered([completion("a")])
    assert ledger.to_commit(["p0"]) == {"p0": 5}


def test_a_new_consumer_never_commits_an_offset_an_earlier_one_read() -> None:
    # The old consumer read p0 to 120 with attempts open at 100..; the broker restarted with an
    # empty log and the consumer was replaced (a commit refused during the new group's
    # rebalance). An attempt ending now must not commit 120 into the new log: the new consumer
    # would start there and skip the decisions written at 0..119 since the restart.
    ledger = Ledger()
    ledger.started("a", 1, "p0", 100)
    ledger.started("b", 1, "p0", 110)
    ledger.read("p0", 120)
    assert ledger.to_commit(["p0"]) == {"p0": 100}
    ledger.reconnected()
    ledger.delivered([completion("a"), completion("b")])
    assert ledger.to_commit(["p0"]) == {}  # nothing read by the new consumer yet
    ledger.read("p0", 30)  # the new log, from its start
    assert ledger.to_commit(["p0"]) == {"p0": 30}


def test_recent_ends_are_kept_and_a_restarted_log_is_recognised_by_its_ends() -> None:
    ledger = Ledger(kept=3)
    ledger.delivered([completion("a")], now=100.0)
    ledger.delivered([completion("b"), completion("c")], now=150.0)
    ledger.delivered([completion("d")], now=160.0)  # a is forgotten (3 kept)
    assert [c.request_id for c in ledger.recent_ends(150.0)] == ["b", "c", "d"]
    assert [c.request_id for c in ledger.recent_ends(155.0)] == ["d"]
    ledger.acknowledged_end(0, 41)
    ledger.acknowledged_end(1, 7)
    assert not ledger.log_restarted({0: 42, 1: 9})  # the log grew: kept what it acknowledged
    ledger.acknowledged_end(0, 41)
    assert ledger.log_restarted({0: 3, 1: 9})  # partition 0 ends before our completion at 41
    assert not ledger.log_restarted({0: 3})  # (the old acknowledgements are forgotten)
