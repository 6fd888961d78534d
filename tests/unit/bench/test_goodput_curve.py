"""``python -m bench.goodput_curve``: the table it prints and the document ``tokenfleet report`` draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goodput_curve import POLICIES, main


def test_a_tiny_curve_prints_each_load_and_writes_the_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "curve.json"
    spec = "tiny=synthetic:duration_s=20,rate_per_s=2@1.0"
    assert main(["--workload", spec, "--loads", "0.5,1", "--jobs", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny (L67 = rate scale 1):" in printed and "0.5 x L67" in printed and "1 x L67" in printed
    document = json.loads(out.read_text())
    points = document["curve"]["tiny"]["points"]
    assert [p["load"] for p in points] == [0.5, 1.0]
    for point in points:
        # every policy, plus least-tokens: the twin slomax+least-tokens is judged against
        assert set(point["policies"]) == {*POLICIES, "least-tokens"}
        assert point["policies"]["slomax+tokenpilot"]["rejected_met_without_admission"] is not None
        assert point["policies"]["tokenpilot"]["rejected_met_without_admission"] is None


def test_a_workload_that_is_neither_known_nor_spelled_out_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--workload", "nonesuch"])
    assert exit_info.value.code == 2
    assert "not one of synthetic, mooncake, azure-code" in capsys.readouterr().err
