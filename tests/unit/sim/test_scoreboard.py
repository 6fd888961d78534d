"""The scoreboard's verdict: TokenPilot's capacity and latency against the references it is judged by."""

from __future__ import annotations

from typing import Any

from sim.evaluation.scoreboard import PEERS, POLICIES, capacity_table, verdict, verdict_table


def found(scale: float | None, mape: float | None = None) -> dict[str, Any]:
    return {"rate_scale": scale, "ttft_prediction_mape": mape}


def document(workload: str = "mooncake") -> dict[str, Any]:
    capacity = {name: found(1.0) for name in POLICIES}
    capacity.update(
        {
            "tokenpilot": found(2.5, mape=0.07),
            "least-tokens": found(2.0),
            "dynamo-kv": found(1.6),
            "llm-d-default": found(None),  # not even the lowest scale: never "best"
            "sglang-cache-aware": found(1.9),
        }
    )
    at_peer = {
        "tokenpilot": {"ttft_p50_s": 0.3, "ttft_p95_s": 1.5},
        "sglang-cache-aware": {"ttft_p50_s": 0.4, "ttft_p95_s": 2.0},
    }
    return {
        "workload": workload,
        "engine": "perturbed",
        "capacity": capacity,
        "compared_at": {"reference": "sglang-cache-aware", "rate_scale": 1.9, "policies": at_peer},
    }


def test_verdict_takes_the_best_faithful_peer_by_capacity() -> None:
    v = verdict(document())
    assert v["best_peer"] == "sglang-cache-aware"  # least-tokens carries more but is no peer
    assert "least-tokens" not in PEERS
    assert v["vs_best_peer"] == round(2.5 / 1.9, 4) and v["target_vs_best_peer"] == 1.25
    assert v["vs_least_tokens"] == 1.25
    assert v["p50_at_peer_capacity"] == -0.25 and v["p95_at_peer_capacity"] == -0.25
    assert v["prediction_mape"] == 0.07
    row = verdict_table([v]).splitlines()[-1]
    assert row.startswith(
        "| mooncake | perturbed | x2.5 | sglang-cache-aware x1.9 | 1.32x (>= 1.25) | 1.25x |"
    )
    assert "-25.0%" in row and "7.0%" in row


def test_azure_code_is_judged_against_least_tokens_only() -> None:
    v = verdict(document("azure-code"))
    assert v["target_vs_best_peer"] is None
    assert "(>=" not in verdict_table([v]).splitlines()[-1]


def test_capacity_table_has_a_row_per_policy_and_a_column_per_run() -> None:
    table = capacity_table([document(), document("synthetic")]).splitlines()
    assert table[0] == "| policy | mooncake / perturbed | synthetic / perturbed |"
    assert len(table) == 2 + len(POLICIES)
    assert "| llm-d-default | - | - |" in table
    assert "| tokenpilot | 2.5 | 2.5 |" in table
    priced = {**document(), "capacity": {name: {"rate_scale": 1.0} for name in POLICIES}}
    priced["capacity"]["tokenpilot"]["cost_per_million_goodput_tokens"] = 0.7149
    assert "| tokenpilot | 1 ($0.71/M) |" in capacity_table([priced]).splitlines()
