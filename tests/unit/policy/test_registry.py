"""Policies named by their stages, built from a config mapping; clear errors otherwise."""

from __future__ import annotations

import pytest

from agents.policy import PolicyError, build_scheduler, policy_names
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.registry import parse_policy
from agents.policy.tokenpilot import TokenPilot


def test_a_router_alone_composes_with_the_default_stages() -> None:
    s = build_scheduler("tokenpilot", seed=3)
    assert isinstance(s.admission, PassThrough) and isinstance(s.dc_selection, HomeDc)
    assert isinstance(s.instance_selection, TokenPilot) and s.name == "tokenpilot"
    assert parse_policy("pass-through+home-dc+dynamo-kv") == ("pass-through", "home-dc", "dynamo-kv")


def test_parameters_come_from_a_mapping() -> None:
    s = build_scheduler("tokenpilot", params={"tokenpilot": {"tie_tolerance": 0.05, "prefill_budget": 4096}})
    assert isinstance(s.instance_selection, TokenPilot)
    assert (s.instance_selection.tie_tolerance, s.instance_selection.prefill_budget) == (0.05, 4096)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("slomaxx+tokenpilot", None, "unknown stage 'slomaxx'"),
        ("tokenpilot+home-dc", None, "in the order"),
        ("pass-through", None, "names no instance-selection stage"),
        ("tokenpilot", {"tokenpilot": {"speed": 2}}, "unknown parameter speed for stage 'tokenpilot'"),
        ("tokenpilot", {"dynamo-kv": {}}, "does not use"),
    ],
)
def test_bad_names_and_parameters_say_what_is_known(name: str, params: dict | None, message: str) -> None:
    with pytest.raises(PolicyError, match=message) as error:
        build_scheduler(name, params=params)
    if "unknown stage" in message:
        assert all(known in str(error.value) for known in policy_names())
        assert "pass-through" in str(error.value) and "home-dc" in str(error.value)


def test_bounds_are_not_policies() -> None:
    assert "ideal" not in policy_names() and "ideal-fleet-cache" not in policy_names()
