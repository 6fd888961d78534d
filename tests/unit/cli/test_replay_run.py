"""``tokenfleet replay --run RUN --policy P``'s parts that need no store (``cli/replay_run.py``): the
self error's arithmetic, the fleet put on the fitted profiles or on a profiles file's, the
calibration's JSON, the printed comparison, and bad input (a bad ``--profiles`` file too) as one
line and exit 2 before the store is opened (``tests/integration/test_replay_run.py`` replays a
stored run)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cli.store
from cli.main import main
from cli.replay_calibrate import (
    FittedProfiles,
    GroupFit,
    _profile_names,
    calibration_entry,
    file_calibration,
    profile_for,
)
from cli.replay_report import draw_figures, relative_error, replay_lines, self_error
from cli.replay_run import replay_fleet
from infra.clickhouse.calibration_samples import GroupSamples
from sim.engine.calibration import TERMS, Calibration
from sim.engine.profiles import BUILT_IN, PROFILES, load_profiles, profiles_text

LLAMA = PROFILES["llama3-8b-h100"]


@pytest.mark.parametrize(
    ("predicted", "observed", "error"),
    [
        (110.0, 100.0, 0.1),
        (90, 100, -0.1),
        (4 / 3, 1.0, 0.3333),
        (0.0, 2.0, -1.0),
        (1.0, 0.0, None),  # nothing observed: no relative error
        (None, 1.0, None),  # a percentile on a request that never got a first token
        (1.0, None, None),
        (True, 1.0, None),
    ],
)
def test_the_relative_error_is_signed_and_rounded(predicted: Any, observed: Any, error: float | None) -> None:
    assert relative_error(predicted, observed) == error


def test_the_self_error_compares_the_four_figures() -> None:
    observed = {"goodput_tokens_per_s": 200.0, "ttft_p50_s": 0.5, "ttft_p95_s": None, "compliant_share": 0.8}
    predicted = {"goodput_tokens_per_s": 190.0, "ttft_p50_s": 0.6, "ttft_p95_s": 2.0, "compliant_share": 0.9}
    assert self_error(predicted, observed) == {
        "goodput": -0.05,
        "ttft_p50": 0.2,
        "ttft_p95": None,
        "compliant_share": 0.125,
    }


def group(model: str, profile: str) -> GroupSamples:
    columns = {name: np.zeros(0) for name in ("arrival_s", "ttft_s")}
    return GroupSamples(model, profile, ("i0", "i1"), 1, 3.0, columns, 820, 4, 0)


def fitted(name: str, model: str, profile: str, kept: tuple[str, ...] = (), *messages: str) -> GroupFit:
    profile_fit = replace(LLAMA, name=name, t0_s=0.02)
    fit = Calibration(profile_fit, 40, 40, 0.01, 0.02, 0.3, 0.4, kept, messages)
    return GroupFit(group(model, profile), name, fit)


FITS = FittedProfiles(
    (
        fitted("vllm@a", "a", "vllm"),
        fitted("vllm@b", "b", "vllm"),
        fitted("llama3-8b-h100", "c", "llama3-8b-h100"),
    )
)
"""Two models' engines whose heartbeats name ``vllm``, and a model on a built-in profile."""


def exported_fleet() -> dict[str, Any]:
    """A fleet as ``replay export`` writes one, of the groups of ``FITS`` and one that served nothing."""
    return {
        "data_centres": [
            {"name": "A", "instances": [{"count": 2, "profile": "vllm", "model": "a"}]},
            {
                "name": "B",
                "instances": [
                    {"count": 1, "profile": "vllm", "model": "b", "price_per_hour": None},
                    {"count": 1, "profile": "llama3-8b-h100", "model": "c"},
                    {"count": 1, "profile": "qwen3-14b-h100", "model": "d"},  # served nothing: built-in
                ],
            },
        ]
    }


def test_each_group_of_the_fleet_runs_on_the_profile_fitted_to_it() -> None:
    doc = exported_fleet()
    fleet = replay_fleet("run-1", doc, FITS.profile_set())
    placed = [(s.dc, s.model, s.profile.name, s.profile.t0_s) for s in fleet.instances]
    assert placed == [
        ("A", "a", "vllm@a", 0.02),
        ("A", "a", "vllm@a", 0.02),
        ("B", "b", "vllm@b", 0.02),
        ("B", "c", "llama3-8b-h100", 0.02),  # the fitted one, not the built-in one
        ("B", "d", "qwen3-14b-h100", PROFILES["qwen3-14b-h100"].t0_s),
    ]
    assert doc["data_centres"][0]["instances"][0]["profile"] == "vllm"  # the export is left as it was
    doc["data_centres"][0]["instances"].append({"count": 1, "profile": "sglang", "model": "e"})
    with pytest.raises(ValueError, match="instances of e named 'sglang' completed nothing"):
        replay_fleet("run-1", doc, FITS.profile_set())


def test_the_fit_names_a_groups_profile_and_finds_it_again_by_one_rule() -> None:
    groups = [group("a", "vllm"), group("b", "vllm"), group("c", ""), group("d", "sglang")]
    assert _profile_names(groups) == ["vllm@a", "vllm@b", "c", "sglang"]
    profiles = FittedProfiles(
        tuple(fitted(n, g.model, g.profile) for n, g in zip(_profile_names(groups), groups, strict=True))
    )
    found = [profile_for(g.model, g.profile, profiles.profile_set()) for g in groups]
    assert found == ["vllm@a", "vllm@b", "c", "sglang"]
    assert profile_for("e", "vllm", profiles.profile_set()) is None  # vllm is two models': neither is e's
    assert profile_for("e", "qwen3-14b-h100", BUILT_IN) == "qwen3-14b-h100"


def test_a_profiles_file_puts_each_group_where_the_fit_did(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(profiles_text(FITS.profiles, FITS.models))
    loaded = load_profiles(path)
    on_file = replay_fleet("run-1", exported_fleet(), loaded, path)
    on_fit = replay_fleet("run-1", exported_fleet(), FITS.profile_set())
    assert [(s.model, s.profile) for s in on_file.instances] == [
        (s.model, s.profile) for s in on_fit.instances
    ]
    entries = file_calibration(on_file, loaded, path)
    assert list(entries) == ["vllm@a", "vllm@b", "llama3-8b-h100"]  # not qwen3-14b-h100: built-in
    assert entries["vllm@b"]["profiles_file"] == str(path) and entries["vllm@b"]["model"] == "b"
    assert entries["vllm@b"]["parameters"]["t0_s"] == 0.02
    doc = exported_fleet()
    doc["data_centres"][0]["instances"].append({"count": 1, "profile": "sglang", "model": "e"})
    with pytest.raises(ValueError) as refused:
        replay_fleet("run-1", doc, loaded, path)
    assert str(refused.value) == (
        f"{path} has no profile for the instances of e named 'sglang' (run 'run-1') "
        "and no built-in profile describes them"
    )


def test_the_calibration_says_which_terms_kept_the_prior_and_why() -> None:
    why = "decode_s_per_seq: batch sizes too alike (standard error 74% of the prior's value): kept 3.5e-05"
    entry = calibration_entry(fitted("vllm", "m", "vllm", ("decode_s_per_seq",), "a note", why))
    assert entry["kept_at_prior"] == {"decode_s_per_seq": why.split(": ", 1)[1]}
    assert entry["parameters"]["t0_s"] == 0.02 and set(TERMS) <= set(entry["parameters"])
    assert entry["residual_error"] == {"ttft": 0.01, "tpot": 0.02, "prior_ttft": 0.3, "prior_tpot": 0.4}
    assert (entry["model"], entry["heartbeat_profile"], entry["instances"]) == ("m", "vllm", 2)
    assert entry["notes"] == ["a note", why]
    too_few = calibration_entry(fitted("vllm", "m", "vllm", TERMS, "only 3 attempts ..."))
    assert set(too_few["kept_at_prior"]) == set(TERMS)
    assert all(reason.startswith("too few rows to fit") for reason in too_few["kept_at_prior"].values())


def test_the_comparison_shows_each_policy_and_the_one_that_ran_beside_what_was_observed() -> None:
    def figures(goodput: float, share: float, p50: float | None) -> dict[str, Any]:
        return {
            "goodput_tokens_per_s": goodput, "compliant_share": share, "ttft_p50_s": p50, "ttft_p95_s": 1.5,
            "cost_per_million_goodput_tokens": None, "per_class": {"batch": {"compliant_share": share}},
        }  # fmt: skip

    observed = figures(100.0, 0.8, 0.25)
    results = {"round-robin": figures(110.0, 0.88, 0.2), "tokenpilot": figures(150.0, 0.9, None)}
    document = {
        "results": results,
        "observed": observed,
        "self_error": self_error(results["round-robin"], observed),
    }
    lines = replay_lines(document, "round-robin")
    rows = {line.split()[0]: line.split() for line in lines if line.strip()}
    assert rows["policy"][:5] == ["policy", "goodput", "tok/s", "compliant", "batch"]
    assert rows["tokenpilot"] == ["tokenpilot", "150.0", "90.0%", "90.0%", "-", "1.500", "-"]
    assert rows["observed"] == ["observed", "100.0", "80.0%", "80.0%", "0.250", "1.500", "-"]
    assert rows["goodput"] == ["goodput", "110.0", "100.0", "+10.0%"]
    assert rows["ttft_p50"] == ["ttft_p50", "0.200", "0.250", "-20.0%"]
    assert rows["compliant_share"] == ["compliant_share", "88.0%", "80.0%", "+10.0%"]
    assert not any(line.startswith("round-robin, the policy") for line in replay_lines(document, None))


def test_the_draws_give_each_figure_its_median_and_range_and_the_self_error_takes_the_median() -> None:
    def figures(goodput: float, p50: float | None) -> dict[str, Any]:
        return {"goodput_tokens_per_s": goodput, "compliant_share": 0.9, "ttft_p50_s": p50, "ttft_p95_s": 1.0}

    draws = [
        {"round-robin": figures(100.0, 0.30), "tokenpilot": figures(150.0, 0.2)},
        {"round-robin": figures(90.0, 0.50), "tokenpilot": figures(160.0, None)},
        {"round-robin": figures(120.0, 0.40), "tokenpilot": figures(155.0, 0.1)},
    ]
    spread = draw_figures(draws)
    assert spread["round-robin"]["goodput_tokens_per_s"] == {"median": 100.0, "min": 90.0, "max": 120.0}
    assert spread["round-robin"]["ttft_p50_s"] == {"median": 0.40, "min": 0.30, "max": 0.50}
    assert spread["tokenpilot"]["ttft_p50_s"] is None  # a draw without the figure: no median of it
    assert spread["round-robin"]["cost_per_million_goodput_tokens"] is None  # no draw has it

    observed = {**figures(100.0, 0.5), "per_class": {}}
    document = {
        "seed": 7,
        "results": draws[0],
        "draws": {"seeds": [7, 8, 9], "figures": spread},
        "observed": observed,
        "self_error": self_error({"ttft_p50_s": 0.40, "goodput_tokens_per_s": 100.0}, observed),
    }
    lines = replay_lines(document, "round-robin")
    assert any("(seed 7, the first of 3 draws)" in line for line in lines)
    assert any(line.startswith("over the 3 draws (seeds 7-9): median [min, max]") for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.strip()}
    assert rows["round-robin"][1:3] == ["100.0", "[90.0,"]  # the spread table's row (the last one)
    assert rows["ttft_p50"] == ["ttft_p50", "0.400", "0.500", "-20.0%"]  # the median's error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "r", "--policy", "nope"], "unknown stage 'nope' in policy 'nope'; known"),
        (["--run", "r", "--policy", "round-robin", "--draws", "0"], "--draws must be at least 1, not 0"),
        (["--run", "r"], "Invalid value for '--policy': give at least one --policy"),
        (["--run", "r", "--policy", "round-robin", "--planner", "nope"], "Invalid value for '--planner'"),
        (["--run", " ", "--policy", "round-robin"], "--run must name a run"),
        (["--run", "r", "--policy", "round-robin", "--since", "soon"], "--since 'soon' is not a time"),
        (["--policy", "round-robin", "export", "--run", "r", "--out", "o"], "give --run and its options"),
        (["--profiles", "p.yaml", "export", "--run", "r", "--out", "o"], "give --run and its options"),
        (["--run", "r", "--policy", "round-robin", "--profiles", "/nowhere/p.yaml"],
         "cannot read profiles file /nowhere/p.yaml: [Errno 2] No such file"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_before_the_store_is_opened(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    def no_store(url: str) -> None:
        raise AssertionError("the store was opened")

    monkeypatch.setattr(cli.store, "open_store", no_store)
    assert main(["replay", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tokenfleet replay: error: {message}") and err.count("\n") == 1, err


def test_a_bad_profiles_file_is_one_line_before_the_store_is_opened(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_store(url: str) -> None:
        raise AssertionError("the store was opened")

    monkeypatch.setattr(cli.store, "open_store", no_store)
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  vllm: {t0_s: 0.01}\n")
    assert main(["replay", "--run", "r", "--policy", "round-robin", "--profiles", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"tokenfleet replay: error: {path}: profile 'vllm': missing prefill_s_per_token, " + (
        "prefill_s_per_token_pair, decode_s_per_seq, decode_s_per_context_token, kv_tokens "
        "(a profile of a new name needs the law and kv_tokens)\n"
    )
