"""Smoke run of the decision-latency benchmark at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.decision import build_universe, instance_content, main


def test_instances_hold_exactly_their_share_of_a_skewed_universe() -> None:
    rng = np.random.default_rng(1)
    universe = build_universe(2_000, rng)
    contents = [instance_content(universe, 500, rng) for _ in range(8)]
    assert all(len(c) == len(np.unique(c)) == 500 for c in contents)
    # Popular prefixes are shared: some block is on every instance, and most are on few.
    _, holders = np.unique(np.concatenate(contents), return_counts=True)
    assert holders.max() == 8
    assert np.median(holders) < 8


def test_benchmark_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    results = main(
        [
            "--instances",
            "4,16",
            "--blocks-per-instance",
            "400",
            "--decisions",
            "60",
            "--warmup",
            "10",
            "--conversations",
            "1000",
            "--json",
            str(out),
        ]
    )
    assert [r["instances"] for r in results] == [4, 16]
    for r in results:
        assert r["blocks_held_min"] == 400
        assert r["memberships"] == 400 * r["instances"]
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"]
        assert r["decisions_per_s"] > 0
        assert 0.5 < r["hit_share"] <= 1.0  # requests come from what the caches hold
    assert json.loads(out.read_text()) == results
