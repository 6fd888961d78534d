"""``tokenfleet demo``: the tables it prints and its progress off a terminal."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, RenderableType

from lab.demo import LEGEND, Counter, LoadProgress, comparison, summary_line, summary_table
from schemas.codec import encode
from schemas.events import AdmissionDecision, Completion
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ


def _render(renderable: RenderableType, width: int = 120) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    with console.capture() as captured:
        console.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]


def _rows(lines: list[str]) -> list[list[str]]:
    """The body rows, split on whitespace (below the header's rule)."""
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return [line.split() for line in lines[rule + 1 :] if line.strip()]


def test_comparison_lists_every_class_of_every_policy_side_by_side() -> None:
    interactive = {
        "ttft_p50_s": 0.397,
        "ttft_p95_s": 1.366,
        "goodput_tokens_per_s": 812.3,
        "compliant_share": 0.7,
    }
    results: dict[str, dict[str, Any]] = {
        "round-robin": {
            "per_class": {"interactive": interactive},
            "total": interactive,
            "cost": {
                "gpu_seconds_busy": 900.4,
                "wasted_gpu_seconds": 610.2,
                "gpu_seconds_idle": 19.6,
                "cost": 0.76,
                "cost_per_million_goodput_tokens": 15.59,
            },
        },
        "slomax+tokenpilot": {
            "per_class": {
                "interactive": {**interactive, "ttft_p50_s": 0.357, "compliant_share": 0.99, "rejected": 3},
                "long_context": {"ttft_p50_s": 2.055, "ttft_p95_s": None},
            },
            "total": {**interactive, "goodput_tokens_per_s": 1624.6, "rejected": 3},
        },
    }
    lines = _render(comparison(results), width=200)
    assert lines[0] == "comparison (same load, read back from ClickHouse)"
    assert lines[1].split() == [
        "class", "policy", "goodput", "tok/s", "compliant", "TTFT", "p50", "TTFT", "p95", "rejected", "timed",
        "out",
    ]  # fmt: skip
    # A row per class and policy; a class missing from a run reads zero, its latency "-".
    assert [" ".join(row) for row in _rows(lines)] == [
        "interactive round-robin 812.3 70.0% 0.397 1.366 0 0",
        "slomax+tokenpilot 812.3 99.0% 0.357 1.366 3 0",
        "long_context round-robin 0.0 0.0% - - 0 0",
        "slomax+tokenpilot 0.0 0.0% 2.055 - 0 0",
        "all round-robin 812.3 70.0% 0.397 1.366 0 0",
        "slomax+tokenpilot 1624.6 70.0% 0.397 1.366 3 0",
        "goodput slomax+tokenpilot / round-robin: 2.00x (1624.6 vs 812.3 tok/s)",
        "cost round-robin: $15.590 per million compliant tokens ($0.7600; GPU-seconds busy 900, wasted 610, "
        "idle 20)",
        "cost slomax+tokenpilot: - per million compliant tokens ($0.0000; GPU-seconds busy 0, wasted 0, "
        "idle 0)",
        *(" ".join(line.split()) for line in LEGEND),
    ]


def test_the_last_policy_is_compared_with_the_strongest_baseline_first() -> None:
    def run(goodput: float, timeouts: int) -> dict[str, Any]:
        total = {"goodput_tokens_per_s": goodput, "timeout": timeouts}
        return {"per_class": {"interactive": total}, "total": total}

    results = {
        "round-robin": run(300.0, 440),
        "tokenpilot": run(2400.0, 44),
        "slomax+tokenpilot": run(3240.0, 0),
    }
    lines = _render(comparison(results), width=200)
    assert [line for line in lines if line.startswith("goodput ")] == [
        "goodput slomax+tokenpilot / tokenpilot, the strongest baseline: 1.35x (3240.0 vs 2400.0 tok/s)",
        "goodput slomax+tokenpilot / round-robin: 10.80x (3240.0 vs 300.0 tok/s)",
    ]
    all_rows = [row for row in _rows(lines) if row[-1] in {"440", "44"}]
    assert len(all_rows) == 4  # interactive and all, round-robin and tokenpilot: timeouts shown


def test_summary_keeps_columns_and_number_formats() -> None:
    result: dict[str, Any] = {
        "requests_published": 61,
        "answered": 61,
        "decisions": 58,
        "completions": 58,
        "dlq": 2,
        "clickhouse_rows": 244,
        "total": {"rejected": 3, "held": 5},
        "per_class": {
            "interactive": {
                "requests": 50,  # the store counts rejected requests too
                "completed": 47,
                "rejected": 3,
                "held": 5,
                "rejects_by_reason": {"expired": 3},
                "holds_by_reason": {"predicted TTFT 1.42 to 1.61 s over 1.25 s (headroom and margin)": 5},
                "timeout": 2,
                "ttft_p50_s": 0.3456,
                "ttft_p95_s": 1.2,
                "goodput_tokens_per_s": 812.345,
                "compliant_share": 0.955,
            },
            "batch": {"requests": 11, "completed": 11, "ttft_p50_s": None},
        },
    }
    assert summary_line(result, "slomax+tokenpilot") == (
        "policy slomax+tokenpilot: published 61, answered 61 (rejected 3), decisions 58, completions 58, "
        "dlq 2, clickhouse rows 244"
    )
    lines = _render(summary_table(result), width=160)
    assert lines[0].split() == [
        "class", "answered", "completed", "rejected", "timed", "out", "held", "TTFT", "p50", "TTFT", "p95",
        "goodput", "tok/s", "compliant",
    ]  # fmt: skip
    # Rows keep the summary's class order; missing values read "-" (latency) or zero; then the
    # top reasons of rejects and holds (with their numbers), and what the columns and "-" mean.
    assert [" ".join(row) for row in _rows(lines)] == [
        "interactive 50 47 3 2 5 0.346 1.200 812.3 95.5%",
        "batch 11 11 0 0 0 - - 0.0 0.0%",
        "interactive rejected: expired (3)",
        "interactive held: predicted TTFT 1.42 to 1.61 s over 1.25 s (headroom and margin) (5)",
        *(" ".join(line.split()) for line in LEGEND),
    ]
    assert any(line.startswith("TTFT -: ") for line in LEGEND)


def test_progress_off_a_terminal_writes_a_few_lines() -> None:
    out = io.StringIO()
    counts = {DECISIONS.name: 0, COMPLETIONS.name: 0, DLQ.name: 0}
    with LoadProgress(30.0, Console(file=out, width=120, color_system=None)) as progress:
        for tenth in range(0, 400):  # 40 s of updates, ten a second
            counts[DECISIONS.name] = counts[COMPLETIONS.name] = tenth
            progress.update(tenth / 10, counts, phase="load" if tenth < 300 else "drain")
    lines = out.getvalue().splitlines()
    assert len(lines) == 5  # at 0, 10, 20, 30 s, and the final counts
    assert lines[0] == "[demo] load 0/30 s: decisions 0, completions 0, dlq 0"
    assert lines[-1] == "[demo] drain 40 s: decisions 399, completions 399, dlq 0"


def test_a_request_is_answered_by_its_completion_or_its_reject_and_nothing_else() -> None:
    counter = Counter("127.0.0.1:9")  # never started: only its bookkeeping is tested

    def admission(rid: str, action: str) -> bytes:
        return encode(
            AdmissionDecision(request_id=rid, model="m", slo_class="interactive", action=action, policy="p")
        )

    done = Completion(
        request_id="done", instance_id="i0", model="m", status="timeout", arrival_ts=1.0, input_tokens=1,
        output_tokens=0,
    )  # fmt: skip
    counter._answer(COMPLETIONS.name, encode(done))
    counter._answer(ADMISSION.name, admission("turned-away", "reject"))
    counter._answer(ADMISSION.name, admission("held", "queue"))
    counter._answer(ADMISSION.name, b"{not json")
    assert counter.answered == {"done", "turned-away"}
