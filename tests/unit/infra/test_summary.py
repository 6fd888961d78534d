"""The run summary's pure parts: its window, and the hold reasons' numbers shown as ranges."""

from __future__ import annotations

from infra.clickhouse.summary import measurement_window, with_ranges


def test_each_number_becomes_its_range_with_the_texts_decimals() -> None:
    text = "predicted TTFT 1.42 s over 1.30 s (headroom and margin)"
    assert with_ranges(text, [1.42, 1.25], [8.6, 1.3]) == (
        "predicted TTFT 1.42 to 8.60 s over 1.25 to 1.30 s (headroom and margin)"
    )
    assert with_ranges("held 3 times over 2 s", [3.0, 2.0], [3.0, 2.0]) == "held 3 times over 2 s"
    assert with_ranges("no instance has prefill room", [], []) == "no instance has prefill room"


def test_the_window_is_the_span_of_first_arrivals_or_runs_to_the_last_end() -> None:
    assert measurement_window(3, 1_000, 9_000, 15_000) == (1_000, 9_000)  # the arrivals' span
    assert measurement_window(2, 1_000, 1_000, 4_500) == (1_000, 4_500)  # one instant: to the last end
    assert measurement_window(1, 1_000, 1_000, 1_200) == (1_000, 2_000)  # at least 1 s
    assert measurement_window(1, 1_000, 1_000, None) == (1_000, 2_000)  # nothing ended
    assert measurement_window(0, 0, 0, None) == (0, 0)
