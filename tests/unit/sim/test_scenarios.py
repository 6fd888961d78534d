"""Multi-DC simulation: scenario files, network round trips, DC outages, violations, the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from sim.engine.fleet import fleet_from_doc
from sim.evaluation.scenario import run_scenario
from sim.loop.config import SimConfig
from sim.loop.runner import MAX_FAILURE_RETRIES, simulate
from sim.scenarios import SCENARIO_DIR, load_scenario, scenario_names
from sim.workloads.trace import load_records

SHIPPED = ["dc-failure", "hotspot", "pinned-tenant", "version-mismatch"]


def small(name: str, tmp_path: Path, seconds: float = 40.0, share: float = 0.25, **fleet: Any) -> Path:
    """A shipped scenario cut to ``seconds`` of traffic at ``share`` of its rates (same fleet,
    rules and outages unless ``fleet`` overrides keys), written to ``tmp_path``."""
    doc = yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())
    for source in doc["workload"]:
        source["duration_s"] = min(float(source["duration_s"]), seconds)
        source["start_s"] = min(float(source.get("start_s", 0.0)), seconds / 2)
        source["rate_per_s"] = float(source["rate_per_s"]) * share
    doc["fleet"].update(fleet)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_shipped_scenario_loads_with_its_homes_and_disjoint_sources() -> None:
    assert scenario_names() == SHIPPED
    for name in SHIPPED:
        scenario = load_scenario(name)
        homes = {r.home_dc for r in scenario.workload.requests}
        assert homes <= {"B", "C", "D"} and "B" in homes
        assert scenario.fleet.ingress_dc == "A" and "A" in scenario.fleet.dc_names
        assert not [s for s in scenario.fleet.instances if s.dc == "A"]  # the ingress has no GPUs
        by_source: dict[str, set[int]] = {}
        for r in scenario.workload.requests:
            by_source.setdefault(r.request_id.split("-")[0], set()).update(r.block_hashes)
        sources = list(by_source.values())
        for i, blocks in enumerate(sources):
            for other in sources[i + 1 :]:
                assert not blocks & other  # no false sharing between sources
    assert load_scenario("hotspot").hotspot is not None
    assert load_scenario("dc-failure").fleet.outages[0].dc == "D"


def test_an_unknown_scenario_names_the_shipped_ones() -> None:
    with pytest.raises(ValueError, match="shipped: dc-failure, hotspot"):
        load_scenario("nope")


def test_a_request_sent_across_the_network_pays_the_round_trip_in_its_ttft() -> None:
    """Idle instances in B: with B 200 ms from the ingress, every TTFT and E2E is exactly 200 ms
    longer than with B at the ingress (half on the way there, half on the way back)."""
    records = [
        {"timestamp": 1000 * t, "input_length": 3000, "output_length": 20, "home_dc": "B", "hash_ids": [t, 7]}
        for t in range(5)
    ]
    workload = load_records(records, name="spaced")
    ttfts, e2es = [], []
    for rtt_ms in (0, 200):
        doc = {
            "ingress": "A",
            "data_centres": [
                {"name": "A"},
                {"name": "B", "instances": [{"count": 1, "profile": "llama3-8b-h100"}]},
            ],
            "rtt_ms": {"A": {"B": rtt_ms}},
        }
        run = simulate(workload, fleet_from_doc(doc, Path("two.yaml")), "local-only", SimConfig())
        ttfts.append([a.first_token_s - a.arrival_s for a in run.attempts])  # type: ignore[operator]
        e2es.append([a.end_s - a.arrival_s for a in run.attempts])  # type: ignore[operator]
    assert [f - n for n, f in zip(*ttfts, strict=True)] == pytest.approx([0.2] * 5, abs=1e-9)
    assert [f - n for n, f in zip(*e2es, strict=True)] == pytest.approx([0.2] * 5, abs=1e-9)


def test_an_outage_fails_what_ran_there_and_fleetmind_stops_sending_within_two_heartbeats(
    tmp_path: Path,
) -> None:
    path = small(
        "dc-failure", tmp_path, seconds=60, share=0.3, outages=[{"dc": "D", "down_s": 20, "up_s": 40}]
    )
    scenario = load_scenario(str(path))
    config = SimConfig()
    document = run_scenario(scenario, ["fleetmind+tokenpilot", "local-only"], config)
    results: Any = document["results"]
    fleetmind, local = results["fleetmind+tokenpilot"], results["local-only"]
    (outage,) = fleetmind["outages"]
    assert outage["sent_after_detection"] == 0
    assert outage["last_sent_after_down_s"] is not None and outage["last_sent_after_down_s"] <= 2 * 0.25
    assert fleetmind["violations"]["total"] == 0
    assert fleetmind["notices"]["by_kind"]["dc_down"] == 1 and fleetmind["notices"]["by_kind"]["dc_up"] == 1
    assert outage["dc_share_recovered_after_s"] is not None and outage["dc_share_recovered_after_s"] <= 30
    # local-only keeps sending D's requests to D while it is down: each is a violation and fails.
    assert local["outages"][0]["sent_after_detection"] > 0
    assert local["violations"]["cut_off"] == local["outages"][0]["sent_after_detection"]
    assert local["failed"] > 0
    run = simulate(scenario.workload, scenario.fleet, "local-only", config)
    failed = [a for a in run.attempts if a.status == "failed"]
    assert failed and all(a.dc == "D" for a in failed)
    retried = {(a.request.request_id, a.attempt + 1) for a in failed if a.attempt <= MAX_FAILURE_RETRIES}
    assert retried <= {(a.request.request_id, a.attempt) for a in run.attempts}  # the client retried


def test_only_fleetmind_keeps_to_versions_and_residency(tmp_path: Path) -> None:
    for name, kind in (("version-mismatch", "version"), ("pinned-tenant", "residency")):
        scenario = load_scenario(str(small(name, tmp_path, seconds=40, share=0.5)))
        document = run_scenario(scenario, ["fleetmind+tokenpilot", "global-least-load"], SimConfig())
        results: Any = document["results"]
        assert results["fleetmind+tokenpilot"]["violations"]["total"] == 0, name
        assert results["global-least-load"]["violations"][kind] > 0, name


def test_simulate_scenario_cli_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small("hotspot", tmp_path, seconds=20, share=0.1)
    out = tmp_path / "out.json"
    code = main(
        [
            "simulate",
            "--scenario",
            str(path),
            "--policy",
            "fleetmind",
            "--policy",
            "local-only",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "fleetmind" in printed and "violations" in printed
    import json

    document = json.loads(out.read_text())
    assert set(document["results"]) == {"fleetmind", "local-only"}
    assert "hotspot" in document["results"]["fleetmind"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["simulate", "--scenario", "nope"], "unknown scenario 'nope'"),
        (["simulate", "--scenario", "hotspot", "--workload", "synthetic"], "drop --workload"),
        (["capacity", "--scenario", "hotspot", "--workload", "synthetic"], "drop --workload"),
        (["simulate"], "--workload"),
    ],
)
def test_scenario_cli_errors_are_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
