"""The store's summary of a run against the simulator's own figures for it: a simulated run is
stored as the stack stores one (``lab/simulated_store.py``) and read back by ``summary()``, on
the real embedded ClickHouse engine (chdb)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from infra.clickhouse import connect, migrate, summary
from lab.simulated_store import store_run
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES
from sim.evaluation.metrics import report
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.sources import open_workload
from sim.workloads.trace import Workload

FLEET = FleetSpec(
    "2", tuple(InstanceSpec(f"i{k}", "A", "llama3-8b", "1", PROFILES["llama3-8b-h100"]) for k in range(2))
)
LOADS = {
    "round-robin": "synthetic:duration_s=60,rate_per_s=10,batch_jobs_per_hour=0",  # clients retry
    "slomax+tokenpilot": "synthetic:duration_s=60,rate_per_s=12,batch_jobs_per_hour=0",  # rejects
}
QUIET_S = 120.0
"""The last request arrives this long after the others, when every attempt has ended."""


def with_a_quiet_end(workload: Workload) -> Workload:
    """``workload`` and one more request ``QUIET_S`` after its last: nothing runs at W's end."""
    last = workload.requests[-1]
    quiet = replace(last, request_id="quiet", arrival_s=last.arrival_s + QUIET_S)
    return Workload(workload.name, (*workload.requests, quiet))


@pytest.mark.parametrize("policy", list(LOADS))
@pytest.mark.parametrize("quiet_end", [True, False], ids=["quiet-end", "busy-end"])
def test_the_store_reads_a_run_as_the_simulator_measured_it(
    tmp_path: Path, policy: str, quiet_end: bool
) -> None:
    workload = open_workload(LOADS[policy], seed=3)
    workload = with_a_quiet_end(workload) if quiet_end else workload
    config = SimConfig(seed=3)
    result = simulate(workload, FLEET, policy, config)
    statuses = {a.status for a in result.attempts}
    assert ("rejected" if policy != "round-robin" else "aborted") in statuses  # what the run is for
    assert policy != "round-robin" or any(a.attempt > 1 for a in result.attempts)  # retried
    simulated = report(result.attempts, result.window, config.slo_classes, result.busy_s)

    with connect(f"chdb:///{tmp_path / 'clickhouse'}") as client:
        migrate(client)
        store_run(client, result, FLEET, "run", origin=float(int(time.time()) - 900))
        stored = summary(client, run_id="run")

    assert stored["window_s"] == pytest.approx(result.window[1] - result.window[0], abs=1e-3)
    classes = cast(dict[str, dict[str, Any]], simulated["per_class"])
    per_class = cast(dict[str, dict[str, Any]], stored["per_class"])
    pairs = [("total", cast(dict[str, Any], simulated), cast(dict[str, Any], stored["total"]))]
    pairs += [(name, figures, per_class[name]) for name, figures in classes.items()]
    for name, expected, got in pairs:
        assert (got["requests"], got["completed"]) == (expected["requests"], expected["completed"]), name
        assert got["goodput_tokens_per_s"] == pytest.approx(expected["goodput_tokens_per_s"], rel=1e-4), name
        for key in ("ttft_p50_s", "ttft_p95_s"):
            assert (got[key] is None) == (expected[key] is None), (name, key)
            assert got[key] is None or got[key] == pytest.approx(expected[key], abs=1e-3), (name, key)
        if quiet_end:
            assert got["compliant_share"] == pytest.approx(expected["compliant_share"], abs=1e-4), name
    # The store keeps no token times: of an attempt still running at W's end it counts the tokens
    # its mean TPOT puts inside W, where the simulator counts those it generated (on a busy end,
    # decoding speeds up after W as the load drains, so the store's estimate runs high).
    total = cast(dict[str, Any], stored["total"])
    assert total["compliant_share"] == pytest.approx(simulated["compliant_share"], abs=0.05)
