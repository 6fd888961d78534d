"""``tokenfleet demo --policy A --policy B``: the side-by-side comparison it prints."""

from __future__ import annotations

from typing import Any

from infra.entrypoints.demo import _compare


def test_comparison_lists_every_class_of_every_policy() -> None:
    results: dict[str, dict[str, Any]] = {
        "round-robin": {"per_class": {"interactive": {"ttft_p50_s": 0.397, "ttft_p95_s": 1.366}}},
        "tokenpilot": {
            "per_class": {
                "interactive": {"ttft_p50_s": 0.357, "ttft_p95_s": 1.069},
                "long_context": {"ttft_p50_s": 2.055, "ttft_p95_s": None},
            }
        },
    }
    lines = _compare(results).splitlines()
    assert "round-robin" in lines[2] and "tokenpilot" in lines[2]
    assert lines[3].split() == ["interactive", "0.397", "/", "1.366", "0.357", "/", "1.069"]
    assert lines[4].split() == ["long_context", "-", "/", "-", "2.055", "/", "-"]
