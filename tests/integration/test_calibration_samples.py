"""The calibration's samples read from the real embedded ClickHouse engine (chdb), written through
the feedback sink (``infra/clickhouse/calibration_samples.py``), and ``tokenfleet replay
calibrate``'s command on them (``cli/replay_calibrate.py``)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from cli.replay_calibrate import calibrate_command
from infra.clickhouse import FeedbackSink, connect, migrate
from infra.clickhouse.calibration_samples import calibration_samples
from schemas.events import Completion, Heartbeat
from sim.engine.busy_windows import Observations, observations_from_attempts
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES, load_profiles
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.sources import open_workload

NOW = time.time()  # heartbeats are kept a week: recent times
LLAMA = PROFILES["llama3-8b-h100"]


def completion(request_id: str, instance: str, model: str = "llama3-8b", **fields: Any) -> Completion:
    values: dict[str, Any] = {
        "status": "ok", "arrival_ts": NOW - 60, "ts": NOW - 58, "ttft_s": 0.5, "tpot_s": 0.02, "e2e_s": 2.0,
        "input_tokens": 100, "cached_tokens": 0, "output_tokens": 76,
    }  # fmt: skip
    values.update(fields)
    return Completion(request_id=request_id, instance_id=instance, model=model, **values)


def beat(instance: str, ts: float, running: int, waiting: int = 0, used: int = 0, **fields: Any) -> Heartbeat:
    values: dict[str, Any] = {
        "dc": "eu", "model": "llama3-8b", "model_version": "1", "profile": "llama3-8b-h100",
        "tokens_in_flight": 0, "kv_blocks_total": 820, "price_per_hour": 3.0,
    }  # fmt: skip
    values.update(fields)
    return Heartbeat(
        ts=ts, instance_id=instance, running=running, waiting=waiting, kv_blocks_used=used, **values
    )


def stored(observed: Observations, k: int, origin: float) -> Completion:
    """Attempt ``k`` of a simulated run as the stack's completion, on a clock from ``origin``."""

    def duration(name: str) -> float | None:
        value = float(getattr(observed, name)[k])
        return None if math.isnan(value) else value

    return completion(
        f"r{k}",
        str(observed.instance[k]),
        status="ok" if observed.ok[k] else "timeout",
        arrival_ts=origin + observed.arrival_s[k],
        ts=origin + observed.end_s[k],
        ttft_s=duration("ttft_s"),
        tpot_s=duration("tpot_s"),
        e2e_s=duration("e2e_s"),
        input_tokens=int(observed.input_tokens[k]),
        cached_tokens=int(observed.cached_tokens[k]),
        output_tokens=int(observed.output_tokens[k]),
    )


def test_samples_are_grouped_by_the_heartbeats_model_and_profile(client: Client) -> None:
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-a")
    first = completion("r1", "i0", arrival_ts=NOW - 60.0017, ttft_s=0.25)
    sink.write_completions(
        [
            first,
            first,  # redelivered: read once
            completion("r2", "i0", status="timeout", ttft_s=None, tpot_s=None, e2e_s=None, output_tokens=0),
            completion("r3", "i1", model="tiny", input_tokens=300, cached_tokens=256),
            completion("r4", "i2"),  # an instance that never heartbeat
        ]
    )
    FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-b").write_completions(
        [completion("other", "i0")]
    )
    sink.write_heartbeats(
        [
            beat("i0", NOW - 50, running=4, waiting=2, used=100),  # at its most, others waiting, room
            beat("i0", NOW - 49, running=4, waiting=2, used=800),  # ... but the KV cache full
            beat("i0", NOW - 48, running=4),  # ... nobody waiting
            beat("i0", NOW - 47, running=1, waiting=3, used=10, kv_blocks_total=900),
            beat("i0", NOW - 46, running=4, waiting=1, used=700),  # at its most, others waiting, full
            beat(
                "i1",
                NOW - 50,
                running=2,
                model="tiny",
                profile="vllm",
                gpus=2,
                price_per_hour=None,
                kv_block_tokens=32,
                max_seqs=32,
                prefill_budget_tokens=2048,
            ),
        ]
    )
    groups = calibration_samples(client, "run-a")
    assert [(g.model, g.profile, g.instances) for g in groups] == [
        ("llama3-8b", "", ("i2",)),
        ("llama3-8b", "llama3-8b-h100", ("i0",)),
        ("tiny", "vllm", ("i1",)),
    ]
    unknown, llama, tiny = groups
    assert (unknown.kv_blocks_total, unknown.gpus, unknown.price_per_hour) == (0, 1, None)
    assert (llama.kv_blocks_total, llama.max_running, llama.beats_at_seat_limit) == (900, 4, 1)
    assert (llama.beats_waiting_at_most, tiny.beats_waiting_at_most) == (3, 0)  # KV room or not
    assert (llama.gpus, llama.price_per_hour, tiny.gpus, tiny.price_per_hour) == (1, 3.0, 2, None)
    assert (llama.kv_block_tokens, tiny.kv_block_tokens) == (0, 32)  # (the engine's block size, if said)
    limits = [(g.max_seqs, g.prefill_budget_tokens) for g in (llama, tiny)]
    assert limits == [(0, 0), (32, 2048)]  # (the scheduler's limits, if declared)
    columns = llama.completions
    assert llama.attempts == 2 and sorted(columns["ok"]) == [False, True]
    ok = int(np.flatnonzero(columns["ok"])[0])
    assert columns["arrival_s"][ok] == pytest.approx(math.floor((NOW - 60.0017) * 1000) / 1000)
    assert (columns["ttft_s"][ok], columns["e2e_s"][ok], columns["output_tokens"][ok]) == (0.25, 2.0, 76)
    assert columns["end_s"][ok] == pytest.approx(NOW - 58, abs=1e-3)
    assert math.isnan(columns["ttft_s"][1 - ok]) and math.isnan(columns["e2e_s"][1 - ok])
    assert (tiny.completions["input_tokens"][0], tiny.completions["cached_tokens"][0]) == (300, 256)
    assert calibration_samples(client, "no-such-run") == []


def test_calibrate_writes_the_profiles_simulate_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of two engines slower than the built-in profile they are named after, stored as the
    stack stores it: the command fits them and writes that profile, replaced."""
    truth = replace(
        LLAMA, t0_s=LLAMA.t0_s * 1.3, decode_s_per_context_token=LLAMA.decode_s_per_context_token * 1.2
    )
    fleet = FleetSpec("2", tuple(InstanceSpec(f"i{k}", "dc-1", "llama3-8b", "1", truth) for k in range(2)))
    trace = open_workload("synthetic:duration_s=60,rate_per_s=8,share_doc_qa=0,batch_jobs_per_hour=0", seed=2)
    observed = observations_from_attempts(simulate(trace, fleet, "round-robin", SimConfig(seed=2)).attempts)
    origin = NOW - 600  # the run's clock: ten minutes ago
    events = [stored(observed, k, origin) for k in range(len(observed))]
    url = f"chdb:///{tmp_path / 'clickhouse'}"
    with connect(url) as client:
        migrate(client)
        sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-1")
        sink.write_completions(events)
        sink.write_heartbeats(
            [beat(f"i{k}", origin + t, running=3) for k in range(2) for t in range(0, 60, 5)]
        )
    out = tmp_path / "replay" / "profiles.yaml"
    calibrate_command("run-1", out, url)
    printed = capsys.readouterr().out
    assert "llama3-8b / llama3-8b-h100 -> llama3-8b-h100: 2 instances" in printed
    assert "residual error (relative RMS): TTFT" in printed and f"wrote {out}" in printed
    fitted = load_profiles(out).get("llama3-8b-h100")
    assert fitted.t0_s == pytest.approx(truth.t0_s, rel=0.03)
    assert fitted.decode_s_per_context_token == pytest.approx(truth.decode_s_per_context_token, rel=0.05)
    assert (fitted.kv_tokens, fitted.price_per_hour) == (820 * 512, 3.0)
    with pytest.raises(ValueError, match="run 'run-2' has no completions"):
        calibrate_command("run-2", out, url)
