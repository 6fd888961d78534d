"""Fail closed, as a property: whatever the fleet, the rules and the requests, FleetMind never
admits a request onto a row the hard rules, the model, the version or the health check forbid.

For every outcome of a ``fleetmind+<router>`` scheduler over random worlds:
- an ``admit`` lands on a row whose DC the rules allow for the request, of the request's model,
  at the resolved version (when there is one), ready, with a fresh heartbeat (now - heartbeat
  <= 2 x 0.25 s), in a reachable DC; so when no row is all of that, the request is not admitted;
- a ``reject`` happens only when no row is all of that (never a false reject), and says why:
  ``no_version`` only when the model version is deployed nowhere, else ``not_permitted``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.policy.fleetmind.rules import FleetRules, parse_rules
from agents.policy.types import BoolArray, ClusterView, RequestView
from tests.unit.policy.fleetmind.helpers import Inst, fleet_view, fleetmind, request

DC_NAMES = ("d0", "d1", "d2", "d3", "d4")
REGIONS = ("r1", "r2", "r3")
TENANTS = ("t0", "t1", "t2")
MODELS = ("m1", "m2")
VERSIONS = ("v1", "v2")
STALE_AFTER_S = 0.5
EXAMPLES = 500
# Heartbeat ages (s) around the 0.5 s limit and well on either side of it; fresh ones more often.
AGES = (0.0, 0.0, 0.05, 0.1, 0.25, 0.4, 0.49, 0.5, 0.5, 0.51, 0.6, 0.75, 1.5, 3.0)
TOKENS = (0, 1000, 50_000, 400_000)
# One instance is one integer (generation is most of this test's time): its model, version,
# readiness (3 in 4 ready), heartbeat age and tokens in flight, in mixed radix.
INSTANCE_RADIX = (len(MODELS), len(VERSIONS), 4, len(AGES), len(TOKENS))
INSTANCE_CODES = st.integers(0, int(np.prod(INSTANCE_RADIX)) - 1)


def decode_instance(dc: str, code: int, now_s: float) -> Inst:
    digits = []
    for radix in INSTANCE_RADIX:
        code, digit = divmod(code, radix)
        digits.append(digit)
    model, version, ready, age, tokens = digits
    return Inst(
        dc,
        model=MODELS[model],
        version=VERSIONS[version],
        ready=ready > 0,
        tokens=TOKENS[tokens],
        heartbeat_s=now_s - AGES[age],
    )


@dataclass(frozen=True)
class Step:
    view: ClusterView
    now_s: float
    requests: tuple[RequestView, ...]


@dataclass(frozen=True)
class World:
    doc: dict[str, Any]
    as_mapping: bool  # hand FleetMind the YAML mapping rather than the parsed FleetRules
    steps: tuple[Step, ...]


def names_from(draw: st.DrawFn, pool: tuple[str, ...]) -> list[str]:
    return draw(st.lists(st.sampled_from(pool), max_size=3, unique=True))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    dcs = DC_NAMES[: draw(st.integers(1, 5))]
    region = {dc: draw(st.sampled_from(REGIONS)) for dc in dcs}
    described = [dc for dc in dcs if draw(st.integers(0, 4))]  # now and then a DC the rules omit
    tenants: dict[str, Any] = {}
    for tenant in (*TENANTS, "default"):
        if not draw(st.integers(0, 2)):  # a rule for one tenant in three
            rule: dict[str, Any] = {}
            if draw(st.booleans()):
                rule["regions"] = names_from(draw, (*REGIONS, "r9"))
            if draw(st.booleans()):
                rule["dcs"] = names_from(draw, (*dcs, "d9"))
            if draw(st.booleans()):
                rule["cross_region"] = draw(st.booleans())
            tenants[tenant] = rule
    pins = {m: {"version": draw(st.sampled_from(VERSIONS))} for m in MODELS if draw(st.booleans())}
    owners = draw(st.lists(st.sampled_from(TENANTS), max_size=2, unique=True))
    reservations = [
        {
            "tenant": owner,
            "model": draw(st.sampled_from(MODELS)),
            "instances": draw(st.integers(1, 2)),
            "dcs": draw(st.lists(st.sampled_from(dcs), min_size=1, max_size=3, unique=True)),
        }
        for owner in owners
    ]
    doc = {
        "data_centres": [{"name": dc, "region": region[dc]} for dc in described],
        "tenants": tenants,
        "models": pins,
        "reservations": reservations,
    }
    steps: list[Step] = []
    now = 100.0
    for k in range(draw(st.integers(1, 3))):
        now += draw(st.sampled_from([0.05, 0.3, 0.6, 2.0, 11.0]))
        if k and draw(st.booleans()):
            view = steps[-1].view  # the same snapshot, later: its heartbeats age
        else:
            instances = [
                decode_instance(dc, code, now)
                for dc in dcs
                for code in draw(st.lists(INSTANCE_CODES, max_size=4))
            ]
            unreachable = [dc for dc in dcs if not draw(st.integers(0, 4))]
            rtt = {dc: draw(st.sampled_from([0.0, 0.01, 0.1, 0.4])) for dc in dcs}
            view = fleet_view(instances, rtt=rtt, unreachable=unreachable)
        requests = tuple(
            request(
                f"s{k}-r{j}",
                draw(st.sampled_from((*TENANTS, "stranger"))),
                draw(st.sampled_from((*MODELS, *MODELS, "m3"))),
                home=draw(st.sampled_from(("", *dcs, "d9"))),
                regions=() if draw(st.integers(0, 2)) else tuple(names_from(draw, (*REGIONS, *dcs))),
                version=draw(st.sampled_from(("", "", *VERSIONS))),
                blocks=tuple(draw(st.lists(st.integers(0, 3), max_size=4))),
            )
            for j in range(draw(st.integers(1, 4)))
        )
        steps.append(Step(view, now, requests))
    return World(doc, draw(st.booleans()), tuple(steps))


def servable(rules: FleetRules, req: RequestView, view: ClusterView, now_s: float) -> BoolArray:
    """The rows the hard rules, model, version and health check all allow for ``req``."""
    version = rules.version_for(req)
    rows: BoolArray = (
        view.ready & (view.model == req.model) & (now_s - view.last_heartbeat_s <= STALE_AFTER_S)
    )
    if version:
        rows &= view.model_version == version
    for row, dc in enumerate(view.dc):
        rows[row] &= view.dcs.is_reachable(str(dc)) and rules.allows(req, str(dc))
    return rows


def deployed_anywhere(rules: FleetRules, req: RequestView, view: ClusterView) -> bool:
    version = rules.version_for(req)
    rows = view.model == req.model
    if version:
        rows &= view.model_version == version
    return bool(rows.any())


def violations(world: World, router: str, stats: Counter[str]) -> list[str]:
    rules = parse_rules(world.doc)
    sched = fleetmind(world.doc if world.as_mapping else rules, router=router)
    found = []
    for step in world.steps:
        outcomes = sched.tick(step.view, step.now_s) + sched.submit(step.requests, step.view, step.now_s)
        for o in outcomes:
            stats[o.action] += 1
            ok = servable(rules, o.request, step.view, step.now_s)
            if o.action == "admit":
                if not (0 <= o.instance < len(step.view) and ok[o.instance]):
                    found.append(f"admitted {o.request} on forbidden row {o.instance} ({o.instance_id})")
                elif o.dc != str(step.view.dc[o.instance]):
                    found.append(f"outcome dc {o.dc} != row's dc {step.view.dc[o.instance]}")
            elif o.action == "reject":
                if ok.any():
                    found.append(
                        f"rejected {o.request} ({o.reason}) though rows {np.flatnonzero(ok)} serve it"
                    )
                code = o.reason.split(":")[0]
                expected = "not_permitted" if deployed_anywhere(rules, o.request, step.view) else "no_version"
                if code != expected:
                    found.append(f"rejected {o.request} as {code}, expected {expected}")
            stats["servable" if ok.any() else "unservable"] += 1
    return found


@pytest.mark.parametrize("router", ["least-tokens", "tokenpilot"])
def test_no_outcome_breaks_a_hard_rule(router: str) -> None:
    stats: Counter[str] = Counter()
    found: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None)
    @given(world=worlds())
    def run(world: World) -> None:
        stats["examples"] += 1
        bad = violations(world, router, stats)
        found.extend(bad)
        assert bad == []

    run()
    assert found == [] and stats["examples"] >= EXAMPLES
    # The worlds exercise every answer, on servable and unservable requests alike.
    assert min(stats["admit"], stats["queue"], stats["reject"]) > 50, stats
    assert min(stats["servable"], stats["unservable"]) > 200, stats
