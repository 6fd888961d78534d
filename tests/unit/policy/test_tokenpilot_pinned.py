"""TokenPilot's decisions, pinned: a change that moves a single decision fails here.

Three seeded simulations (about 2 400 decisions: a uniform pool of 8, a mixed pool of 8 with
SLOMax in front and two deciders, a pool of 32 that many instances share prefixes on) are run
and every attempt's outcome is compared with ``data/tokenpilot_pinned.json``: where it was sent
(or that it was rejected), exactly, and the TTFT predicted for it, to 8 significant digits (the
predictions' last bits depend on the machine's BLAS). A speed-up must leave all of it unchanged;
a change of policy rewrites the file on purpose, and says why in its commit:

    python -m tests.unit.policy.test_tokenpilot_pinned --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from sim.engine.fleet import parse_fleet
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.sources import open_workload

PINNED = Path(__file__).with_name("data") / "tokenpilot_pinned.json"
CASES = {
    "uniform-8": ("synthetic:duration_s=300", "8xllama3-8b-h100", "tokenpilot", 9.0, 0, 1),
    "mixed-8-slomax-2-deciders": (
        "synthetic:duration_s=120",
        "4xllama3-8b-h100+4xllama3-8b-h100-perturbed",
        "slomax+tokenpilot",
        12.0,
        1,
        2,
    ),
    "uniform-32": ("synthetic:duration_s=60,rate_per_s=20", "32xllama3-8b-h100", "tokenpilot", 8.0, 2, 1),
}


def decisions(case: str) -> dict[str, str]:
    """Every attempt's outcome in arrival order: ``where`` (instance id, or its status when it was
    not sent) and a digest of the predictions rounded to 8 significant digits."""
    workload, fleet, policy, scale, seed, deciders = CASES[case]
    run = simulate(
        open_workload(workload, seed=seed).scaled(scale),
        parse_fleet(fleet),
        policy,
        SimConfig(seed=seed, deciders=deciders),
    )
    attempts = sorted(run.attempts, key=lambda a: (a.arrival_s, a.request.request_id, a.attempt))
    where = [a.instance.spec.instance_id if a.instance is not None else a.status for a in attempts]
    predicted = [f"{a.predicted_ttft_s:.7e}" if a.predicted_ttft_s is not None else "-" for a in attempts]
    return {
        "where": " ".join(where),
        "predicted_sha256": hashlib.sha256(" ".join(predicted).encode()).hexdigest(),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_tokenpilot_decides_as_pinned(case: str) -> None:
    pinned = json.loads(PINNED.read_text())[case]
    now = decisions(case)
    was, is_ = pinned["where"].split(), now["where"].split()
    first = next((k for k, (a, b) in enumerate(zip(was, is_, strict=False)) if a != b), None)
    assert first is None and len(was) == len(is_), (
        f"{case}: decision {first} of {len(was)} moved ({was[first] if first is not None else ''} -> "
        f"{is_[first] if first is not None else ''}); {len(is_)} decisions now"
    )
    assert now["predicted_sha256"] == pinned["predicted_sha256"], f"{case}: a predicted TTFT changed"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps({case: decisions(case) for case in sorted(CASES)}, indent=1) + "\n")
    print(f"wrote {PINNED}")
