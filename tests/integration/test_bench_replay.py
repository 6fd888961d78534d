"""``python -m bench.replay`` on a short run: two emulated vLLM servers on the perturbed profile,
the whole stack per policy (worker with the embedded store, dispatcher, gateway, ``openai``
clients), round-robin run for real, replayed calibrated and nominal under three policies, the
other two run for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import replay_modes
from bench.replay import COUNTERFACTUAL, ERROR_KEYS, RAN, THIRD, BenchOptions, report_lines, run_bench

LOAD_S = 30.0  # per policy, 90 s in all: rows enough for the fit (15 s left its goodput ~4 % off)


def test_the_bench_predicts_each_policy_from_the_round_robin_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = BenchOptions(engines="emulated", duration_s=LOAD_S, users=8, seed=0, data_dir=tmp_path)
    document = run_bench(options)

    policies = (RAN, COUNTERFACTUAL, THIRD)
    for kind in ("self_error", "counterfactual_error"):
        assert set(document[kind]) == set(ERROR_KEYS)
        assert all(isinstance(document[kind][key], float) for key in ERROR_KEYS), document[kind]
    assert document["self_error"] == document["errors"][RAN]["calibrated"]
    assert document["counterfactual_error"] == document["errors"][COUNTERFACTUAL]["calibrated"]
    assert set(document["errors"]) == set(policies) == set(document["observed"]) == set(document["runs"])
    for policy in policies:
        assert (
            document["runs"][policy]["client"]["ok"] > 0 and document["runs"][policy]["client"]["failed"] == 0
        )
        assert set(document["placement"][policy]) == {"local/i000", "local/i001"}
        assert document["predicted"][policy]["goodput_tokens_per_s"] > 0
        assert document["predicted_nominal"][policy]["goodput_tokens_per_s"] > 0
    assert set(document["met"]) == {f"calibrated_goodput.{p}" for p in policies}
    assert document["draws"]["seeds"] == [0, 1, 2, 3, 4]  # predicted: the medians of five draws
    for policy in policies:
        spread = document["draws"]["figures"][policy]["goodput_tokens_per_s"]
        assert document["predicted"][policy]["goodput_tokens_per_s"] == spread["median"]

    # The run the replay was calibrated on: its prediction is within the target, or at least
    # no worse than the uncalibrated (nominal) law's.
    calibrated = abs(document["errors"][RAN]["calibrated"]["goodput"])
    nominal = abs(document["errors"][RAN]["nominal"]["goodput"])
    assert calibrated <= 0.05 or calibrated <= nominal, document["errors"][RAN]
    fit = next(iter(document["calibration"].values()))
    assert fit["rows"]["ttft"] > 0 and fit["rows"]["tpot"] > 0

    printed = "\n".join(report_lines(document))
    assert "target calibrated_goodput round-robin" in printed and "nominal" in printed

    # Its kept data: each engine's calls of the round-robin run, observed and replayed.
    modes = replay_modes.modes(tmp_path, draws=2, windows=(0.0, 10.0))
    assert modes["run"] == document["runs"][RAN]["run_id"]
    assert [draw["seed"] for draw in modes["replayed"]] == [0, 1]
    for figures in (modes["observed"], *modes["replayed"]):
        engines = figures["engines"]
        assert len(engines) == 2 and engines[0]["p50_s"] <= engines[1]["p50_s"]  # fastest first
        assert sum(e["calls"] for e in engines) == sum(w["calls"] for e in engines for w in e["windows"]) > 0
    assert {e["engine"] for e in modes["observed"]["engines"]} == {"emulated-0", "emulated-1"}
    capsys.readouterr()  # the bench's progress
    assert replay_modes.main([str(tmp_path), "--draws", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.replay_modes: --draws must be") and err.count("\n") == 1
