"""Profiles files (``sim/engine/profiles.py``: ``load_profiles``, ``profiles_text``) and fleets that
name their profiles (``sim/engine/fleet.py``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.engine.fleet import parse_fleet
from sim.engine.profiles import BUILT_IN, PROFILES, load_profiles, profiles_text

pytestmark = pytest.mark.unit

LLAMA = PROFILES["llama3-8b-h100"]
MINE = replace(
    LLAMA,
    name="my-engine",
    t0_s=0.008,
    prefill_s_per_token=3e-5,
    decode_s_per_seq=0.0,
    kv_tokens=300_000,
    max_seqs=256,
    attention_growth_tokens=32_768.0,
    gpus=2,
    price_per_hour=None,
    token_delay_s=0.02,
    token_delay_sigma=0.4,
)


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(text)
    return path


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    profiles = load_profiles(
        written(tmp_path, profiles_text({"my-engine": MINE}, {"my-engine": "llama3-8b"}))
    )
    assert profiles.get("my-engine") == MINE
    assert profiles.model_of(MINE) == "llama3-8b"
    assert profiles.get("llama3-8b-h100") == LLAMA  # the built-in ones are still there


def test_the_optional_reals_are_written_only_when_set() -> None:
    text = profiles_text({"llama3-8b-h100": LLAMA}, {})
    assert "token_delay_s" not in text and "noise_sigma" not in text
    assert "token_delay_s: 0.02" in profiles_text({"my-engine": MINE}, {})
    assert "token_delay_sigma: 0.4" in profiles_text({"my-engine": MINE}, {})


def test_a_profile_named_after_a_built_in_one_replaces_it_field_by_field(tmp_path: Path) -> None:
    profiles = load_profiles(written(tmp_path, "profiles:\n  llama3-8b-h100: {t0_s: 0.01, max_seqs: 64}\n"))
    assert profiles.get("llama3-8b-h100") == replace(LLAMA, t0_s=0.01, max_seqs=64)
    assert profiles.model_of(profiles.get("llama3-8b-h100")) == "llama3-8b"
    assert BUILT_IN.get("llama3-8b-h100") == LLAMA  # for this run only


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- a list\n", "expected a mapping 'profiles'"),
        ("profiles: {}\n", "expected a mapping 'profiles'"),
        ("profiles: {x: 3}\n", "profile 'x': expected a mapping of fields"),
        ("profiles: {x: {t0_s: 0.01}}\n", "profile 'x': missing prefill_s_per_token"),
        ("profiles: {llama3-8b-h100: {t0_s: -1}}\n", "t0_s must be a finite number >= 0"),
        ("profiles: {llama3-8b-h100: {t0_s: .nan}}\n", "t0_s must be a finite number >= 0"),
        ("profiles: {llama3-8b-h100: {token_delay_s: -1}}\n", "token_delay_s must be a finite number >= 0"),
        ("profiles: {llama3-8b-h100: {kv_tokens: 1.5}}\n", "kv_tokens must be an integer >= 1"),
        ("profiles: {llama3-8b-h100: {max_seqs: 0}}\n", "max_seqs must be an integer >= 1"),
        (
            "profiles: {llama3-8b-h100: {price_per_hour: cheap}}\n",
            "price_per_hour must be a number >= 0 or null",
        ),
        ("profiles: {llama3-8b-h100: {t0: 0.01}}\n", "unknown field 't0'"),
        ("profiles: {llama3-8b-h100: {model: ''}}\n", "model must be a name"),
        ("profiles: [unclosed\n", "cannot read profiles file"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    path = written(tmp_path, text)
    with pytest.raises(ValueError) as raised:
        load_profiles(path)
    message = str(raised.value)
    assert says in message and str(path) in message and "\n" not in message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read profiles file .*nope\.yaml"):
        load_profiles(tmp_path / "nope.yaml")


def test_a_fleet_names_the_profiles_of_the_file(tmp_path: Path) -> None:
    profiles = load_profiles(written(tmp_path, profiles_text({"my-engine": MINE}, {"my-engine": "mine"})))
    spec = parse_fleet("2xmy-engine", profiles)
    assert [(i.profile, i.model) for i in spec.instances] == [(MINE, "mine")] * 2
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "data_centres:\n  - name: A\n    instances:\n      - {count: 1, profile: my-engine}\n"
        "      - {count: 1, profile: llama3-8b-h100}\n"
    )
    spec = parse_fleet(str(fleet_file), profiles)
    assert [(i.profile.name, i.model) for i in spec.instances] == [
        ("my-engine", "mine"),
        ("llama3-8b-h100", "llama3-8b"),
    ]
    with pytest.raises(ValueError, match="unknown engine profile 'my-engine'"):
        parse_fleet(str(fleet_file))
