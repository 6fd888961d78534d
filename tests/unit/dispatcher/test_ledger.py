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
