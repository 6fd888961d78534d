"""The synthetic mix's day of several models: each model's rate follows its own daily cosine.

Also pins the records of mixes without a day: the new options must not move a single one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

import pytest

from sim.workloads.sources import open_workload
from sim.workloads.synthetic import _UNIQUE_BASE as UNIQUE_BASE
from sim.workloads.synthetic import SyntheticMix

PINNED: dict[str, tuple[dict[str, Any], int, str]] = {
    # The digests of the records before the day existed; a change of them is a change of every
    # seeded synthetic result (and of tests/unit/policy/data/tokenpilot_pinned.json).
    "plain": (
        {"duration_s": 900, "seed": 5},
        3656,
        "34790cd2321d01bbe865e5b9735b93d18091d75e405b3b62c732105e429b12a6",
    ),
    "three-models": (
        {"duration_s": 600, "seed": 1, "rate_per_s": 10, "tenants": 4, "models": ("a", "b", "c")},
        6748,
        "4c75201628daa2ed4ef0bdd1d5160404da40a3285f12da49450b00f595a9e1d0",
    ),
}


def digest(records: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(records).encode()).hexdigest()


@pytest.mark.parametrize("case", sorted(PINNED))
def test_a_mix_without_a_day_keeps_every_record(case: str) -> None:
    """Pinned, and ``day_s``, ``phases`` and a zero ``swing`` alone change nothing."""
    options, count, pinned = PINNED[case]
    records = SyntheticMix(**options).generate()
    assert (len(records), digest(records)) == (count, pinned)
    groups = max(1, len(options.get("models", ())))
    phases = tuple(0.9 / (m + 1) for m in range(groups))
    still = SyntheticMix(**options, day_s=300, swing=0.0, phases=phases).generate()
    assert digest(still) == pinned


def swung_integral(t0: float, t1: float, day_s: float, swing: float, phase: float) -> float:
    """The integral over [t0, t1] of ``1 + swing * cos(2 pi (t / day_s - phase))``."""
    k = 2 * math.pi / day_s
    return (t1 - t0) + swing / k * (
        math.sin(k * t1 - 2 * math.pi * phase) - math.sin(k * t0 - 2 * math.pi * phase)
    )


def test_each_model_follows_its_daily_cosine() -> None:
    """Without bursts and chat turns, every bin's count per model is within 4.5 Poisson sigmas of
    ``rate_per_s * share_m * integral(level_m)``, and each model's busiest bin holds its peak."""
    mix = SyntheticMix(
        duration_s=800,
        rate_per_s=16,
        seed=11,
        burst_factor=1.0,
        share_chat=0.0,
        batch_jobs_per_hour=0.0,
        models=("a", "b"),
        day_s=800,
        swing=0.8,
        phases=(0.1875, 0.6875),  # peaks in the middle of bins 1 and 5
        model_shares=(3.0, 1.0),
    )
    bins, bin_s = 8, 100.0
    counts = Counter((r["model"], int(r["timestamp"] / 1000 // bin_s)) for r in mix.generate())
    for model, share, phase in (("a", 0.75, 0.1875), ("b", 0.25, 0.6875)):
        observed = [counts[(model, b)] for b in range(bins)]
        expected = [
            mix.rate_per_s * share * swung_integral(b * bin_s, (b + 1) * bin_s, 800, 0.8, phase)
            for b in range(bins)
        ]
        for b, (seen, mean) in enumerate(zip(observed, expected, strict=True)):
            assert abs(seen - mean) <= 4.5 * math.sqrt(mean), (model, b, seen, mean)
        busiest = max(range(bins), key=observed.__getitem__)
        assert busiest * bin_s <= phase * 800 < (busiest + 1) * bin_s, (model, observed)
        assert sum(observed) == pytest.approx(mix.rate_per_s * share * mix.duration_s, rel=0.05)


def test_every_record_keeps_its_tenants_model_and_sessions_stay_with_it() -> None:
    models = ("llama3-8b@2", "qwen3-14b", "llama3-70b")
    records = SyntheticMix(duration_s=300, seed=4, tenants=7, models=models, swing=0.9).generate()
    assert {r["task_type"] for r in records} >= {"chat", "doc_qa", "api"}
    for r in records:
        name, _, version = models[int(r["tenant"].removeprefix("tenant-")) % 3].partition("@")
        assert r["model"] == name and r.get("model_version", "") == version
    # The turns of a chat session repeat its history's blocks (ids of its own, never another's):
    # every such block is seen with one model only, and some with several turns.
    seen_with: dict[int, set[str]] = {}
    turns: Counter[int] = Counter()
    for r in records:
        for block in r["hash_ids"]:
            if r["task_type"] == "chat" and block >= UNIQUE_BASE:
                seen_with.setdefault(block, set()).add(r["model"])
                turns[block] += 1
    assert max(turns.values()) >= 3
    assert all(len(names) == 1 for names in seen_with.values())


def test_model_shares_split_the_mean_rate_and_jobs_do_not_share_instructions() -> None:
    records = SyntheticMix(
        duration_s=1200,
        rate_per_s=10,
        seed=2,
        models=("a", "b"),
        model_shares=(1.0, 4.0),
        batch_jobs_per_hour=60.0,
        batch_job_size=(2, 5),
    ).generate()
    interactive = Counter(r["model"] for r in records if r["task_type"] != "batch")
    assert interactive["b"] / sum(interactive.values()) == pytest.approx(0.8, abs=0.04)
    # Each batch job has instruction blocks of its own, whichever model it belongs to.
    jobs = {(r["timestamp"], r["tenant"]): r["hash_ids"][0] for r in records if r["task_type"] == "batch"}
    assert {tenant for _, tenant in jobs} >= {"tenant-0", "tenant-1"}  # jobs of both models
    assert len(set(jobs.values())) == len(jobs)


def test_a_day_without_models_swings_the_whole_mix() -> None:
    records = SyntheticMix(duration_s=600, rate_per_s=20, seed=3, swing=1.0, phases=(0.5,)).generate()
    assert "model" not in records[0]
    per_minute = Counter(int(r["timestamp"] / 60_000) for r in records if r["task_type"] != "batch")
    assert per_minute[4] + per_minute[5] > 5 * (per_minute[0] + per_minute[9])


def test_open_workload_reads_the_day_options() -> None:
    spec = (
        "synthetic:duration_s=240,rate_per_s=6,models=a+b,day_s=120,swing=0.6,phases=0.1+0.6,model_shares=1+3"
    )
    w = open_workload(spec, seed=9)
    direct = SyntheticMix(
        duration_s=240,
        rate_per_s=6,
        seed=9,
        models=("a", "b"),
        day_s=120,
        swing=0.6,
        phases=(0.1, 0.6),
        model_shares=(1.0, 3.0),
    ).generate()
    assert [r.request_id for r in w.requests] == [r["request_id"] for r in direct]
    assert {r.model for r in w.requests} == {"a", "b"}
    with pytest.raises(ValueError, match=r"synthetic phases must be numbers joined with '\+', got 'x'"):
        open_workload("synthetic:models=a+b,phases=0.2+x")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"swing": 1.5}, "synthetic swing must be a finite number in"),
        ({"swing": math.nan}, "synthetic swing must be a finite number in"),
        ({"day_s": -1.0}, "synthetic day_s must be a finite number in"),
        (
            {"models": ("a", "b"), "phases": (0.1,)},
            r"synthetic phases must be a list of one number per model \(2\)",
        ),
        ({"models": ("a", "b"), "phases": (0.1, 1.5)}, "synthetic phases must be a finite number in"),
        ({"phases": [0.5]}, "synthetic phases must be a list"),
        ({"phases": ("x",)}, "synthetic phases must be numbers"),
        ({"models": ("a", "b"), "model_shares": (0.0, 0.0)}, "synthetic model_shares must not all be 0"),
        (
            {"models": ("a", "b"), "model_shares": (1.0, -1.0)},
            "synthetic model_shares must be a finite number",
        ),
        ({"models": ("a", "b", "c"), "tenants": 2, "swing": 0.5}, "synthetic tenants must be >= the number"),
    ],
)
def test_day_options_out_of_range_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticMix(**options)


def test_a_kind_with_no_share_has_no_arrivals() -> None:
    """A zero share used to draw gaps of infinite length forever; now that kind is simply absent."""
    records = SyntheticMix(duration_s=120, seed=1, share_chat=0.0, batch_jobs_per_hour=0.0).generate()
    assert records and {r["task_type"] for r in records} == {"doc_qa", "api"}
