"""The scoreboard's verdict: TokenPilot's changes against the references it is judged by."""

from __future__ import annotations

from typing import Any

from sim.evaluation.scoreboard import verdict, verdict_table


def result(
    p50: float, p95: float | None, goodput: float = 100.0, mape: float | None = None
) -> dict[str, Any]:
    return {
        "ttft_p50_s": p50,
        "ttft_p95_s": p95,
        "output_tokens_per_s": 120.0,
        "goodput_tokens_per_s": goodput,
        "ttft_prediction_mape": mape,
    }


def test_verdict_compares_with_round_robin_the_best_peer_and_least_tokens() -> None:
    document = {
        "workload": "w",
        "rate_scale": 1.0,
        "results": {
            "round-robin": result(1.0, 4.0),
            "least-tokens": result(0.5, 2.0),
            "sglang-cache-aware": result(0.3, None),  # lost requests: infinite P95, never "best"
            "dynamo-kv": result(0.4, 1.0, goodput=110.0),
            "llm-d-default": result(0.2, 3.0),
            "tokenpilot": result(0.2, 0.75, goodput=99.0, mape=0.08),
            "ideal-fleet-cache": result(0.1, 0.5),
        },
    }
    v = verdict(document)
    assert v["best_peer"] == "dynamo-kv"
    assert v["p95_vs_best_peer"] == -0.25
    assert v["p50_vs_best_peer"] == -0.5
    assert v["goodput_vs_best_peer"] == -0.1
    assert v["p50_vs_round_robin"] == -0.8 and v["p95_vs_round_robin"] == -0.8125
    assert v["p95_vs_least_tokens"] == -0.625
    assert v["prediction_mape"] == 0.08 and v["p95_floor_fleet_cache"] == 0.5
    assert "| w | x1.0 | -80.0% | -81.2% | dynamo-kv | -25.0% |" in verdict_table([v])
