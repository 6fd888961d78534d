"""Smoke run of the placements benchmark at a toy size."""

from __future__ import annotations

import pytest

from bench.placements import main, measure


def test_both_deciders_decide_and_apply_each_others_placements() -> None:
    route_us, apply_us = measure(requests=64, batch=8, log_delay_s=0.0, policy="tokenpilot", seed=1)
    assert route_us > 0
    assert apply_us > 0  # (0 when no placement was applied)


def test_bad_arguments_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--batch", "0"])
    assert exited.value.code == 2
    assert "--batch" in capsys.readouterr().err
