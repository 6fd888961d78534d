"""FleetRules: the hard rules (permission, residency, narrowing, cross-region) and parse_rules."""

from __future__ import annotations

from typing import Any

import pytest

from agents.policy.fleetmind.rules import DcInfo, FleetRules, Reservation, TenantRule, parse_rules
from tests.unit.policy.fleetmind.helpers import request

DOC: dict[str, Any] = {
    "data_centres": [
        {"name": "eu-1", "region": "eu", "failure_domain": "eu-a", "gpu_slots": 8},
        {"name": "eu-2", "region": "eu"},
        {"name": "us-1", "region": "us"},
    ],
    "tenants": {
        "acme": {"regions": ["eu"]},
        "bank": {"dcs": ["eu-1", "us-1"]},
        "local": {"cross_region": False},
        "free": {},
        "default": {"regions": ["us"]},
    },
    "models": {"m": {"version": "v2"}},
}
RULES = parse_rules(DOC)
EVERY = ("eu-1", "eu-2", "us-1", "xx-1")  # xx-1: a DC the rules do not describe


def allowed(tenant: str, **kwargs: Any) -> set[str]:
    req = request("r", tenant, **kwargs)
    return {dc for dc in EVERY if RULES.allows(req, dc)}


def test_parse_reads_every_field_with_its_defaults() -> None:
    assert RULES.dcs["eu-1"] == DcInfo("eu-1", "eu", "eu-a", 8)
    assert RULES.dcs["eu-2"] == DcInfo("eu-2", "eu", "eu", 0)  # failure domain defaults to the region
    assert parse_rules({"data_centres": [{"name": "x"}]}).dcs["x"] == DcInfo("x", "x", "x", 0)
    assert RULES.tenants["acme"] == TenantRule(regions=("eu",))
    assert RULES.tenants["local"] == TenantRule(cross_region=False)
    assert "default" not in RULES.tenants and RULES.default_tenant == TenantRule(regions=("us",))
    assert RULES.versions == {"m": "v2"}
    assert parse_rules({}) == FleetRules()


def test_permission_keeps_to_the_tenants_dcs() -> None:
    assert allowed("bank") == {"eu-1", "us-1"}


def test_residency_keeps_to_the_tenants_regions_and_an_undescribed_dc_is_resident_for_none() -> None:
    assert allowed("acme") == {"eu-1", "eu-2"}
    assert not RULES.allows(request("r", "acme"), "xx-1")
    # Without regions nothing about residency excludes the undescribed DC.
    assert allowed("free") == set(EVERY)


def test_unknown_tenant_gets_the_default_rule() -> None:
    assert allowed("nobody") == {"us-1"}  # default: regions [us]; xx-1 has no region
    assert {dc for dc in EVERY if FleetRules().allows(request("r", "nobody"), dc)} == set(EVERY)


@pytest.mark.parametrize(
    ("tenant", "regions", "expected"),
    [
        ("free", ("eu",), {"eu-1", "eu-2"}),  # by region
        ("free", ("us-1", "eu-2"), {"us-1", "eu-2"}),  # by DC name
        ("free", ("xx-1",), {"xx-1"}),
        ("acme", ("eu-2",), {"eu-2"}),  # narrows the tenant's eu
        ("acme", ("us",), set()),  # never adds a DC the tenant may not use
        ("acme", ("us-1", "eu"), {"eu-1", "eu-2"}),
        ("bank", ("eu",), {"eu-1"}),
        ("nobody", ("eu-1", "eu-2"), set()),
    ],
)
def test_the_requests_allowed_regions_only_narrow(
    tenant: str, regions: tuple[str, ...], expected: set[str]
) -> None:
    assert allowed(tenant, regions=regions) == expected


def test_without_cross_region_a_tenant_stays_in_its_home_dcs_region() -> None:
    assert allowed("local", home="eu-1") == {"eu-1", "eu-2"}
    assert allowed("local", home="us-1") == {"us-1"}
    assert allowed("local") == set()  # no home DC: no region to stay in
    assert allowed("local", home="xx-1") == {"xx-1"}  # home of unknown region: the home DC alone
    assert allowed("local", home="eu-1", regions=("eu-2",)) == {"eu-2"}
    assert allowed("free", home="eu-1") == set(EVERY)
    assert not RULES.may_divert(request("r", "local")) and RULES.may_divert(request("r", "acme"))


def test_cross_region_false_combines_with_residency() -> None:
    rules = parse_rules({**DOC, "tenants": {"t": {"regions": ["eu"], "cross_region": False}}})
    req = request("r", "t", home="us-1")
    assert {dc for dc in EVERY if rules.allows(req, dc)} == set()  # home region not resident
    req = request("r", "t", home="eu-2")
    assert {dc for dc in EVERY if rules.allows(req, dc)} == {"eu-1", "eu-2"}


def test_version_for_is_the_requests_own_then_the_pin_then_any() -> None:
    assert RULES.version_for(request("r", model="m", version="v1")) == "v1"
    assert RULES.version_for(request("r", model="m")) == "v2"
    assert RULES.version_for(request("r", model="n")) == ""
    assert RULES.version_for(request("r", model="n", version="v7")) == "v7"


def test_reservations_and_budget_are_parsed() -> None:
    rules = parse_rules(
        {
            "reservations": [{"tenant": "a", "model": "m", "instances": 2, "dcs": ["eu-1", "us-1"]}],
            "gpu_budget": 12,
        }
    )
    assert rules.reservations == (Reservation("a", "m", 2, ("eu-1", "us-1")),)
    assert rules.gpu_budget == 12


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"tenants": {"t": {"cross_region": "no"}}}, "cross_region"),
        ({"tenants": {"t": {"cross_region": 0}}}, "cross_region"),
        ({"tenants": {"t": {"regions": "eu"}}}, "regions"),
        ({"tenants": {"t": {"regions": {"eu": 1}}}}, "regions"),
        ({"tenants": {"t": {"dcs": "eu-1"}}}, "dcs"),
        ({"tenants": {"t": ["eu"]}}, "'t'"),
        ({"reservations": [{"tenant": "a", "model": "m", "instances": 1, "dcs": "eu-1"}]}, "dcs"),
        ({"data_centres": [{"region": "eu"}]}, "name"),
        ({"models": {"m": "v2"}}, "model .m."),
    ],
)
def test_malformed_fields_are_value_errors_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_rules(doc)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"reservations": [{"tenant": "a", "model": "m", "instances": -1, "dcs": ["eu-1"]}]}, "instances"),
        ({"data_centres": [{"name": "eu-1", "gpu_slots": -2}]}, "gpu_slots"),
        ({"gpu_budget": -1}, "gpu_budget"),
    ],
)
def test_negative_counts_are_value_errors_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_rules(doc)
    assert field in str(error.value)


def test_a_tenant_with_two_reservations_is_an_error() -> None:
    doc = {
        "reservations": [
            {"tenant": "a", "model": "m", "instances": 1, "dcs": ["eu-1"]},
            {"tenant": "a", "model": "n", "instances": 1, "dcs": ["us-1"]},
        ]
    }
    with pytest.raises(ValueError, match="two reservations"):
        parse_rules(doc)
    doc["reservations"][1]["tenant"] = "b"
    assert len(parse_rules(doc).reservations) == 2
