"""The streaming benchmark's command line: several policies in one run, compared with the first."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from bench import stream
from bench.stream_run import RunFigures
from lab.measure import CpuShares


def figures(routed_per_s: float, cpu_us: float) -> RunFigures:
    values: dict[str, Any] = {field.name: 0.0 for field in dataclasses.fields(RunFigures)}
    values.update(routed=0, duplicates=0, latency_sent=0, latency_routed=0)
    values.update(throughput_cpu=CpuShares(0.9, 0.2, 0.1), latency_cpu=CpuShares(0.5, 0.4, 0.1))
    values.update(routed_per_s=routed_per_s, worker_cpu_us_per_request=cpu_us)
    return RunFigures(**values)


def test_later_policies_are_given_as_a_share_of_the_first() -> None:
    text = stream.format_comparison(
        {
            "round-robin": [figures(10_000, 50), figures(12_000, 45), figures(9_000, 55)],
            "tokenpilot": [figures(7_000, 80), figures(6_000, 90), figures(8_000, 70)],
        }
    )
    assert text == (
        "tokenpilot routed 7,000 req/s = 70% of round-robin's 10,000 req/s "
        "(worker CPU per request 80 against 50 us)"
    )


def test_both_policies_by_default_each_in_turn_with_fresh_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions: list[tuple[str, list[int]]] = []

    def session(args: argparse.Namespace, policy: str, data_dir: object, runs: range) -> list[RunFigures]:
        sessions.append((policy, list(runs)))
        return [figures(1000.0, 10.0) for _ in runs]

    monkeypatch.setattr(stream, "session", session)
    assert stream.main(["--repeat", "2", "--fresh-broker"]) == 0
    assert sessions == [("round-robin", [0]), ("tokenpilot", [0]), ("round-robin", [1]), ("tokenpilot", [1])]
    sessions.clear()
    assert stream.main(["--policy", "tokenpilot", "--repeat", "2"]) == 0
    assert sessions == [("tokenpilot", [0, 1])]


def test_one_profile_per_policy() -> None:
    args = argparse.Namespace(profile="out/worker.svg", policies=["round-robin", "slomax+tokenpilot"])
    assert stream.profile_path(args, "slomax+tokenpilot") == "out/worker-slomax_tokenpilot.svg"
    args.policies = ["tokenpilot"]
    assert stream.profile_path(args, "tokenpilot") == "out/worker.svg"
