"""``python -m bench.replay_speed`` at a small scale: a simulated run written into the real
embedded store (chdb), then ``tokenfleet replay export``, ``replay calibrate``, ``simulate``,
``replay`` and ``replay --profiles``, each in its own process, timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replay_speed import SpeedOptions, main, report_lines, run_bench

KEYS = {
    "requests",
    "export_s",
    "calibrate_s",
    "export_calibrate_s",
    "simulate_s",
    "replay_s",
    "replay_over_simulate",
    "replay_with_profiles_s",
    "replay_with_profiles_over_simulate",
    "target_met",
}


def test_the_bench_times_export_calibrate_and_replay_of_a_stored_run(tmp_path: Path) -> None:
    options = SpeedOptions(requests=2000, duration_s=600.0, instances=4, seed=0, store=tmp_path / "data")
    document = run_bench(options)

    assert set(document) >= KEYS
    # Every request written to the store comes back as one record of the exported workload.
    assert document["requests"] == 2000
    assert document["exported_requests"] == document["requests"]
    for key in ("export_s", "calibrate_s", "simulate_s", "replay_s", "replay_with_profiles_s"):
        assert document[key] > 0, key
    assert document["export_calibrate_s"] == pytest.approx(
        document["export_s"] + document["calibrate_s"], abs=0.02
    )
    assert document["replay_over_simulate"] == pytest.approx(
        document["replay_s"] / document["simulate_s"], rel=0.01
    )
    assert document["replay_with_profiles_over_simulate"] == pytest.approx(
        document["replay_with_profiles_s"] / document["simulate_s"], rel=0.01
    )
    assert document["target_met"] is (document["export_calibrate_s"] < 60.0)
    assert document["same_result"]  # both replays ran the simulation simulate ran
    log = (tmp_path / "data" / "replay-profiles.log").read_text()
    assert "(not fitted again): vllm" in log and "residual error" not in log  # no fit printed
    fleet = (tmp_path / "data" / "replay" / "fleet.yaml").read_text()
    assert "count: 4" in fleet and "profile: vllm" in fleet

    printed = "\n".join(report_lines(document))
    assert "export+calibrate (target 60 s)" in printed and "replay/simulate" in printed
    assert "replay --profiles/simulate" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "--requests must be at least 1"),
        (["--instances", "x"], "argument --instances: invalid int value"),
        (["--duration-s", "nan"], "--duration-s must be a finite number"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m bench.replay_speed: error: ") and message in err, err
    assert err.count("\n") == 1, err


def test_a_store_that_holds_something_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old").write_text("")
    with pytest.raises(SystemExit) as stopped:
        main(["--store", str(tmp_path), "--json", str(tmp_path / "out.json")])
    assert stopped.value.code == 2 and "is not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["old"]  # no store, no JSON written
