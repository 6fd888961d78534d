"""The fault suite's pure counting helpers (the scenarios themselves run with ``make faults``)."""

from __future__ import annotations

import hashlib
import random

import pytest

from bench.faults import (
    count_lost,
    format_table,
    fuzzed_messages,
    missing_digests,
    once_and_twice,
    p99,
    poison_pills,
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
