"""Smoke run of the placements benchmark at a toy size."""

from __future__ import annotations

import pytest

from bench.placements import main, measure


@pytest.mark.parametrize("log_delay_s", [0.0, 0.002])
def test_both_deciders_decide_and_apply_each_others_placements(log_delay_s: float) -> None:
    costs = measure(requests=64, batch=8, log_delay_s=log_delay_s, policy="tokenpilot", seed=1)
    assert costs.route_us > 0 and costs.apply_us > 0
    # Every request placed (also those deferred once a decider knows it has a peer) and every
    # placement applied by the other decider.
    assert costs.placed == costs.applied == 64


def test_bad_arguments_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--batch", "0"])
    assert exited.value.code == 2
    assert "--batch" in capsys.readouterr().err
