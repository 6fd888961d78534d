"""The run summary's hold reasons: each number of a cause shown as the range it took."""

from __future__ import annotations

from infra.clickhouse.summary import with_ranges


def test_each_number_becomes_its_range_with_the_texts_decimals() -> None:
    text = "predicted TTFT 1.42 s over 1.30 s (headroom and margin)"
    assert with_ranges(text, [1.42, 1.25], [8.6, 1.3]) == (
        "predicted TTFT 1.42 to 8.60 s over 1.25 to 1.30 s (headroom and margin)"
    )
    assert with_ranges("held 3 times over 2 s", [3.0, 2.0], [3.0, 2.0]) == "held 3 times over 2 s"
    assert with_ranges("no instance has prefill room", [], []) == "no instance has prefill room"
