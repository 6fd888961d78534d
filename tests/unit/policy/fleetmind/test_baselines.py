"""The DC baselines: local-only keeps to home; global-least-load balances on load alone."""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.policy.fleetmind.baselines import GlobalLeastLoad, LocalOnly
from agents.policy.pipeline import Scheduler
from agents.policy.pools import NO_CAPACITY_POOL
from agents.policy.registry import build_scheduler
from tests.unit.policy.fleetmind.helpers import Inst, fleet_view, one, request

NOW = 1.0


def inst(dc: str, tokens: int = 0, **kwargs: Any) -> Inst:
    kwargs.setdefault("heartbeat_s", NOW)
    return Inst(dc, tokens=tokens, **kwargs)


def global_least_load() -> Scheduler:
    return build_scheduler(
        "global-least-load+least-tokens", params={"global-least-load": {"heartbeat_s": 0.25}}
    )


# --- local-only ---------------------------------------------------------------------------------


def test_local_only_keeps_to_the_home_dc_however_loaded() -> None:
    sched = build_scheduler("local-only")
    assert sched.instance_selection.name == "tokenpilot"
    view = fleet_view(
        [inst("A", 5_000_000, kv_total=100_000), inst("B"), inst("A", 4_000_000, kv_total=100_000)]
    )
    outcomes = sched.submit([request(f"r{k}", home="A") for k in range(4)], view, NOW)
    assert {(o.action, o.dc) for o in outcomes} == {("admit", "A")}
    assert {o.instance_id for o in outcomes} <= {"A-0", "A-1"}


def test_local_only_holds_when_home_cannot_serve() -> None:
    sched = build_scheduler("local-only")
    view = fleet_view([inst("A", ready=False), inst("B")])
    held = one(sched, request("r", home="A"), view, NOW)
    assert (held.action, held.pool) == ("queue", NO_CAPACITY_POOL)
    assert one(sched, request("r2", home="B"), view, NOW).dc == "B"
    assert one(sched, request("r3"), view, NOW).action == "queue"  # no home: nowhere


def test_local_only_candidates_are_the_home_rows_of_the_model() -> None:
    view = fleet_view([inst("A"), inst("A", model="n"), inst("B"), inst("A", ready=False), inst("A")])
    choice = LocalOnly().select(request("r", home="A"), view, NOW)
    assert choice.dc == "A" and list(np.flatnonzero(choice.candidates)) == [0, 4]


# --- global-least-load ------------------------------------------------------------------------


def test_global_least_load_picks_the_least_loaded_dc_whatever_the_home() -> None:
    # Load = tokens in flight / KV capacity: A 0.5, B 0.1 (per block), C 0.3.
    view = fleet_view([inst("A", 500), inst("B", 100), inst("B", 100), inst("C", 300)])
    view2 = fleet_view([inst("A", 500), inst("B", 100, kv_total=1000), inst("C", 300)])
    assert one(global_least_load(), request("r", home="A"), view, NOW).dc == "B"
    assert one(global_least_load(), request("r", home="C"), view2, NOW).dc == "B"
    choice = GlobalLeastLoad().select(request("r"), view, NOW)
    assert choice.dc == "B" and list(np.flatnonzero(choice.candidates)) == [1, 2]


def test_global_least_load_ignores_tenant_rules_but_never_substitutes_a_named_version() -> None:
    view = fleet_view([inst("A", 500, version="v2"), inst("C", 10, version="v1")])
    # A tenant with rules, from A, no version named: load alone decides.
    outcome = one(global_least_load(), request("r", "eu-only", home="A"), view, NOW)
    assert (outcome.dc, outcome.instance_id) == ("C", "C-0")
    # The request itself names v2 (the wire contract: no substitution): only A serves it.
    outcome = one(global_least_load(), request("r", "eu-only", version="v2", home="A"), view, NOW)
    assert (outcome.dc, outcome.instance_id) == ("A", "A-0")


def test_global_least_load_honours_the_requests_allowed_regions() -> None:
    view = fleet_view([inst("A", 500), inst("B", 10), inst("C", 100)])
    assert one(global_least_load(), request("r", regions=("A", "C")), view, NOW).dc == "C"
    assert one(global_least_load(), request("r", regions=("A",)), view, NOW).dc == "A"
    held = one(global_least_load(), request("r", regions=("Z",)), view, NOW)
    assert (held.action, held.pool) == ("queue", NO_CAPACITY_POOL)


def test_global_least_load_skips_stale_and_unready_instances() -> None:
    view = fleet_view([inst("A", 500), inst("B", 10, heartbeat_s=0.4), inst("C", 0, ready=False)])
    assert one(global_least_load(), request("r"), view, NOW).dc == "A"  # B's heartbeat is 0.6 s old
    view = fleet_view([inst("A", 500), inst("B", 10, heartbeat_s=0.5)])
    assert one(global_least_load(), request("r"), view, NOW).dc == "B"  # 0.5 s: still fresh
    view = fleet_view([inst("A", 500, heartbeat_s=0.0)])
    assert one(global_least_load(), request("r"), view, NOW).action == "queue"


def test_global_least_load_skips_unreachable_dcs() -> None:
    # Module docstring: "ready instances of the model name in reachable DCs".
    view = fleet_view([inst("A", 500), inst("B", 10)], unreachable=["B"])
    outcome = one(global_least_load(), request("r"), view, NOW)
    assert (outcome.action, outcome.dc) == ("admit", "A")
