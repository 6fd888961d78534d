"""The independent judge of violations (``sim/evaluation/violations.py``): one hand-built case per
kind, a rule clause broken in a copy of FleetMind's rules that only the judge notices, and
agreement with FleetMind's unbroken rules on random fleets."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.policy.fleetmind.capacity import STALE_AFTER_HEARTBEATS as FLEETMIND_STALE_AFTER
from agents.policy.fleetmind.rules import FleetRules, TenantRule, parse_rules
from agents.policy.types import RequestView
from sim.engine.fleet import fleet_from_doc
from sim.evaluation import violations
from sim.evaluation.violations import KINDS, FleetFile, count_violations, judge_run, placement_breaches
from sim.loop.config import SimConfig
from sim.loop.results import Send
from sim.loop.runner import simulate
from sim.scenarios import SCENARIO_DIR, load_scenario
from sim.workloads.trace import TraceRequest, load_records

FLEET: dict[str, Any] = {
    "data_centres": [
        {
            "name": "A",
            "region": "eu-a",
            "instances": [{"count": 1, "profile": "llama3-8b-h100", "version": "2"}],
        },
        {
            "name": "B",
            "region": "eu-b",
            "instances": [{"count": 1, "profile": "llama3-8b-h100", "version": "1"}],
        },
        {"name": "C", "region": "eu-b", "instances": [{"count": 1, "profile": "qwen3-14b-h100"}]},
    ],
    "models": {"llama3-8b": {"version": "2"}},
    "tenants": {
        "shop": {"dcs": ["A", "C"]},
        "bank": {"regions": ["eu-b"]},
        "clinic": {"cross_region": False},
        "default": {"cross_region": True},
    },
    "outages": [{"dc": "B", "down_s": 10, "up_s": 20}],
}
DEFAULT_MODEL = "llama3-8b"


def request(**fields: Any) -> TraceRequest:
    return TraceRequest("r1", 0.0, 600, 10, (), **fields)


def breaches(dc: str, served: str = "llama3-8b@2", **asked: Any) -> tuple[str, ...]:
    """The kinds that sending a request with fields ``asked`` to an instance in ``dc`` serving
    ``served`` (MODEL@VERSION) breaks, on ``FLEET``."""
    model, _, version = served.partition("@")
    return placement_breaches(FleetFile.read(FLEET), request(**asked), dc, model, version, DEFAULT_MODEL)


def sent(dc: str, sent_s: float, taken_s: float, ready: bool = True) -> Send:
    version = {"A": "2", "B": "1", "C": "1"}[dc]
    model = "qwen3-14b" if dc == "C" else "llama3-8b"
    return Send(
        request(model_version=version, model=model), 1, sent_s, f"{dc}/i0", dc, model, version, ready, taken_s
    )


def counted(sends: list[Send], start_s: float = 100.0) -> dict[str, int]:
    return count_violations(FleetFile.read(FLEET), sends, DEFAULT_MODEL, 0.25, start_s)


def test_a_clean_placement_breaks_nothing() -> None:
    assert breaches("A") == ()
    assert breaches("A", tenant="shop") == ()


def test_permission_is_the_tenants_list_of_dcs() -> None:
    assert breaches("B", "llama3-8b@1", model_version="1", tenant="shop") == ("permission",)


def test_residency_is_the_tenants_regions_the_requests_own_narrowing_and_staying_home() -> None:
    assert breaches("A", tenant="bank") == ("residency",)  # A is in eu-a, bank only eu-b
    assert breaches("A", allowed_regions=("eu-b",)) == ("residency",)  # the request's narrowing
    assert breaches("A", allowed_regions=("A",)) == ()  # a DC name narrows too
    assert breaches("B", "llama3-8b@1", model_version="1", tenant="clinic", home_dc="A") == ("residency",)
    assert breaches("C", "qwen3-14b@1", model="qwen3-14b", tenant="clinic", home_dc="B") == ()  # same region
    assert breaches("A", tenant="clinic", home_dc="") == ("residency",)  # no home: nowhere to stay
    assert breaches("A", tenant="clinic", home_dc="A") == ()


def test_version_is_the_requests_own_else_the_pinned_one() -> None:
    assert breaches("B", "llama3-8b@1") == ("version",)  # pinned "2", B serves "1"
    assert breaches("B", "llama3-8b@1", model_version="1") == ()  # the request names "1" itself
    assert breaches("A", model_version="1") == ("version",)


def test_model_is_the_requests_own_else_the_fleets_default() -> None:
    assert breaches("C", "qwen3-14b@2") == ("model",)  # names none: the default llama3-8b
    assert breaches("A", model="qwen3-14b") == ("model",)
    assert breaches("C", "qwen3-14b@1", model="qwen3-14b") == ()


def test_not_ready_is_a_row_not_ready_or_older_than_two_heartbeats() -> None:
    assert counted([sent("A", 200.0, 199.9)])["total"] == 0
    assert counted([sent("A", 200.0, 199.9, ready=False)])["not_ready"] == 1
    assert counted([sent("A", 200.0, 199.5)])["not_ready"] == 0  # exactly the window: still fresh
    assert counted([sent("A", 200.0, 199.49)])["not_ready"] == 1


def test_cut_off_is_a_send_into_a_dc_down_for_longer_than_the_window() -> None:
    # B is down from 110 s to 120 s (start 100 s); the window is 0.5 s.
    assert counted([sent("B", 110.4, 109.9)]) == {**dict.fromkeys(KINDS, 0), "total": 0}
    late = counted([sent("B", 110.6, 109.9)])  # its row is stale too, but it counts once
    assert late["cut_off"] == 1 and late["not_ready"] == 0 and late["total"] == 1
    assert counted([sent("B", 120.0, 109.9)])["cut_off"] == 0  # back up: its stale row is not ready
    assert counted([sent("B", 120.0, 109.9)])["not_ready"] == 1


def test_the_total_is_the_sum_of_the_kinds_and_a_fleet_without_a_file_has_no_rules() -> None:
    bad = Send(
        request(model="qwen3-14b", tenant="shop"), 2, 111.0, "B/i0", "B", "llama3-8b", "1", True, 110.9
    )
    found = counted([bad, sent("A", 200.0, 199.0)])
    assert found == {
        "permission": 1, "residency": 0, "version": 0, "model": 1, "not_ready": 1, "cut_off": 1, "total": 4,
    }  # fmt: skip
    assert (
        placement_breaches(FleetFile.read(None), request(tenant="shop"), "B", "llama3-8b", "7", "llama3-8b")
        == ()
    )


def test_the_judges_staleness_window_is_fleetminds() -> None:
    """Stated twice on purpose (the judge imports nothing of FleetMind): they must agree."""
    assert violations.STALE_AFTER_HEARTBEATS == FLEETMIND_STALE_AFTER


# --- a clause broken in a copy of FleetMind's rules ----------------------------------------------


class ScratchRules(FleetRules):
    """A copy of FleetMind's rules whose methods a test may break without touching the original."""


def view_of(send: Send, default_model: str) -> RequestView:
    r = send.request
    return RequestView(
        r.request_id, send.attempt, r.tenant, r.model or default_model, r.slo_class, r.input_tokens,
        r.max_tokens or 2048, r.block_hashes, r.arrival_s, None, r.task_type, r.allowed_regions,
        r.home_dc, r.model_version,
    )  # fmt: skip


def clinic_hot_spot(tmp_path: Path) -> Path:
    """The shipped hot spot, its first 50 s, its hot traffic from a tenant that must stay in its
    home DC's region (``cross_region: false``; every DC has a region of its own)."""
    doc = yaml.safe_load((SCENARIO_DIR / "pinned-tenant.yaml").read_text())
    doc["fleet"]["tenants"] = {"clinic": {"cross_region": False}, "default": {"cross_region": True}}
    for source in doc["workload"]:
        source["duration_s"] = min(float(source["duration_s"]), 50.0)
        source["start_s"] = min(float(source.get("start_s", 0.0)), 25.0)
        if source["name"] in ("hot", "bank"):
            source["tenant"] = "clinic"
    path = tmp_path / "clinic.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_broken_cross_region_clause_is_caught_by_the_judge_not_by_fleetminds_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = load_scenario(str(clinic_hot_spot(tmp_path)))
    fleet, config = scenario.fleet, SimConfig()
    broken = ScratchRules(**{f.name: getattr(fleet.rules, f.name) for f in fields(FleetRules)})

    def cross_region_allowed(self: FleetRules, tenant: str) -> TenantRule:
        return replace(FleetRules.rule_for(self, tenant), cross_region=True)

    monkeypatch.setattr(ScratchRules, "rule_for", cross_region_allowed)
    runs = {
        "intact": simulate(scenario.workload, fleet, "fleetmind+tokenpilot", config),
        "broken": simulate(scenario.workload, replace(fleet, rules=broken), "fleetmind+tokenpilot", config),
    }
    judged = {name: judge_run(run, fleet, config.heartbeat_s) for name, run in runs.items()}
    # What the simulator used to count: the rules the policy decided with, asked again.
    by_fleetminds_rules = sum(
        not broken.allows(view_of(s, fleet.default_model), s.dc) for s in runs["broken"].sends
    )
    assert judged["intact"] is not None and judged["intact"]["total"] == 0
    assert judged["broken"] is not None and judged["broken"]["residency"] > 0
    assert by_fleetminds_rules == 0
    left_home = [
        s for s in runs["broken"].sends if s.request.tenant == "clinic" and s.dc != s.request.home_dc
    ]
    assert judged["broken"]["residency"] == len(left_home)  # every DC is a region of its own


# --- agreement with FleetMind's unbroken rules ----------------------------------------------------

DC_NAMES = ("A", "B", "C")
REGIONS = ("r1", "r2")
MODELS = ("llama3-8b", "qwen3-14b")
VERSIONS = ("1", "2")


@st.composite
def fleet_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A random small fleet file: 1-3 listed DCs (regions shared or not), each with instances of
    random models and versions, random pins and tenants (one of them ``default``)."""
    listed = draw(st.lists(st.sampled_from(DC_NAMES), min_size=1, max_size=3, unique=True))
    centres = []
    for name in listed:
        groups = draw(
            st.lists(
                st.tuples(st.sampled_from(MODELS), st.sampled_from(VERSIONS)),
                min_size=1,
                max_size=2,
                unique=True,
            )
        )
        profiles = {"llama3-8b": "llama3-8b-h100", "qwen3-14b": "qwen3-14b-h100"}
        centre: dict[str, Any] = {
            "name": name,
            "instances": [{"count": 1, "profile": profiles[m], "model": m, "version": v} for m, v in groups],
        }
        region = draw(st.sampled_from((None, *REGIONS)))
        if region is not None:
            centre["region"] = region
        centres.append(centre)
    tenant = st.fixed_dictionaries(
        {},
        optional={
            "regions": st.lists(st.sampled_from((*REGIONS, *DC_NAMES)), max_size=2),
            "dcs": st.lists(st.sampled_from(DC_NAMES), max_size=2),
            "cross_region": st.booleans(),
        },
    )
    return {
        "data_centres": centres,
        "models": draw(
            st.dictionaries(st.sampled_from(MODELS), st.sampled_from(VERSIONS).map(lambda v: {"version": v}))
        ),
        "tenants": draw(st.dictionaries(st.sampled_from(("t1", "t2", "default")), tenant, max_size=3)),
    }


requests = st.builds(
    TraceRequest,
    request_id=st.just("r"),
    arrival_s=st.just(0.0),
    input_tokens=st.just(600),
    output_tokens=st.just(10),
    block_hashes=st.just(()),
    tenant=st.sampled_from(("t1", "t2", "t3")),
    model=st.sampled_from((None, *MODELS)),
    home_dc=st.sampled_from(("", *DC_NAMES, "X")),
    model_version=st.sampled_from(("", *VERSIONS)),
    allowed_regions=st.lists(st.sampled_from((*REGIONS, *DC_NAMES)), max_size=2).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(document=fleet_documents(), asked=requests, dc=st.sampled_from((*DC_NAMES, "X")), data=st.data())
def test_the_judge_and_fleetminds_rules_agree_on_every_placement(
    document: dict[str, Any], asked: TraceRequest, dc: str, data: st.DataObject
) -> None:
    """For the kinds both cover: FleetMind's rules allow (request, DC) ⟺ no permission or residency
    breach; its version (``version_for``) and the view's model match ⟺ no version or model breach."""
    model = data.draw(st.sampled_from(MODELS))
    version = data.draw(st.sampled_from(VERSIONS))
    default_model = fleet_from_doc(document, Path("f.yaml")).default_model
    rules = parse_rules(document)
    view = RequestView(
        "r", 1, asked.tenant, asked.model or default_model, "interactive", 600, 10, (), 0.0,
        allowed_regions=asked.allowed_regions, home_dc=asked.home_dc, model_version=asked.model_version,
    )  # fmt: skip
    found = set(placement_breaches(FleetFile.read(document), asked, dc, model, version, default_model))
    required = rules.version_for(view)
    assert rules.allows(view, dc) == (not found & {"permission", "residency"})
    assert (not required or version == required) == ("version" not in found)
    assert (model == view.model) == ("model" not in found)


@st.composite
def small_runs(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A random fleet file and 40 requests spread over its tenants, homes, models and versions."""
    document = draw(fleet_documents())
    homes = [c["name"] for c in document["data_centres"]]
    records = [
        {
            "timestamp": 50 * i,
            "input_length": draw(st.integers(200, 3000)),
            "output_length": draw(st.integers(5, 60)),
            "tenant": draw(st.sampled_from(("t1", "t2", "t3"))),
            "home_dc": draw(st.sampled_from(homes)),
            "model": draw(st.sampled_from(MODELS)),
            "model_version": draw(st.sampled_from(("", *VERSIONS))),
            "allowed_regions": draw(st.lists(st.sampled_from((*REGIONS, *DC_NAMES)), max_size=1)),
        }
        for i in range(40)
    ]
    return document, records


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_runs())
def test_every_send_fleetmind_makes_on_a_random_fleet_is_judged_clean(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    document, records = case
    fleet = fleet_from_doc(document, Path("random.yaml"))
    run = simulate(load_records(records, "random"), fleet, "fleetmind+tokenpilot", SimConfig())
    assert judge_run(run, fleet, 0.25) == {**dict.fromkeys(KINDS, 0), "total": 0}
