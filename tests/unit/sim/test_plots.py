"""``tokenfleet report``: the pictures a result file gives, and a clear refusal of anything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib import pyplot

from cli.main import main
from sim.engine.fleet import parse_fleet
from sim.evaluation import plots
from sim.evaluation.capacity import capacities
from sim.evaluation.compare import compare
from sim.loop.config import SimConfig
from sim.workloads.sources import open_workload

PNG = b"\x89PNG\r\n\x1a\n"


def _written(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.png"))}


def test_a_simulate_result_gives_ttft_cdfs_and_goodput_per_class(tmp_path: Path) -> None:
    trace = open_workload("synthetic:duration_s=60", seed=2)
    document, _ = compare(
        trace, parse_fleet("2xllama3-8b-h100"), ["least-tokens", "round-robin"], SimConfig()
    )
    quantiles = document["results"]["least-tokens"]["ttft_quantiles_s"]  # type: ignore[index]
    assert len(quantiles) == 101 and quantiles == sorted(q for q in quantiles if q is not None)
    result = tmp_path / "sim.json"
    result.write_text(json.dumps(document))
    assert main(["report", str(result), "--out", str(tmp_path / "out")]) == 0
    pictures = _written(tmp_path / "out")
    assert set(pictures) == {"ttft_cdf.png", "goodput_per_class.png"}
    assert all(data.startswith(PNG) and len(data) > 5_000 for data in pictures.values())


def test_a_capacity_result_gives_the_compliance_curve(tmp_path: Path) -> None:
    trace = open_workload("synthetic:duration_s=60", seed=2)
    document = capacities(
        trace, parse_fleet("2xllama3-8b-h100"), ["least-tokens"], SimConfig(), precision=0.2
    )
    result = tmp_path / "capacity.json"
    result.write_text(json.dumps(document))
    assert main(["report", str(result), "--out", str(tmp_path / "out")]) == 0
    pictures = _written(tmp_path / "out")
    assert list(pictures) == ["capacity.png"] and pictures["capacity.png"].startswith(PNG)


@pytest.mark.parametrize("content", ["not json", "[1, 2, 3]", '{"something": "else"}', '{"results": 5}'])
def test_anything_else_is_one_line_and_exit_2(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tmp_path / "x.json"
    result.write_text(content)
    assert main(["report", str(result), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "RESULT.json" in err
    assert not list(tmp_path.glob("out/*.png"))


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "none.json")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_goodput_curve_gives_goodput_and_compliance_against_load(tmp_path: Path) -> None:
    from bench.goodput_curve import point

    spec = "synthetic:duration_s=30"
    points = [{"load": x, "rate_scale": x, "policies": point(spec, x, 0)} for x in (0.5, 1.0)]
    curve = {"tiny": {"workload": spec, "l67": 1.0, "points": points}}
    result = tmp_path / "curve.json"
    result.write_text(json.dumps({"fleet": "8xllama3-8b-h100", "seed": 0, "curve": curve}))
    assert main(["report", str(result), "--out", str(tmp_path / "out")]) == 0
    pictures = _written(tmp_path / "out")
    assert list(pictures) == ["goodput_curve.png"] and pictures["goodput_curve.png"].startswith(PNG)


def test_a_long_workload_name_wraps_inside_every_title(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def inside(figure: Any, path: Path) -> Path:
        figure.tight_layout()
        renderer = figure.canvas.get_renderer()
        box, frame = figure.axes[0].title.get_window_extent(renderer), figure.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, path.name
        pyplot.close(figure)
        return path

    monkeypatch.setattr(plots, "_save", inside)
    result = {
        "ttft_quantiles_s": [0.1] * 101,
        "per_class": {"interactive": {"goodput_tokens_per_s": 5.0}, "long_context": {}},
    }
    document = {
        "workload": "synthetic:duration_s=600,rate_per_s=6,interactive_share=0.8,long_share=0.2",
        "rate_scale": 1.0,
        "fleet": "2xllama3-8b-h100",
        "results": {"round-robin": result, "tokenpilot": result},
    }
    assert [p.name for p in plots.simulate_plots(document, tmp_path, "")] == [
        "ttft_cdf.png",
        "goodput_per_class.png",
    ]
