"""``tokenfleet replay --run RUN --policy P [--policy Q ...]``: a run's traffic replayed on its own
engines, calibrated, under other policies, beside what the store recorded of it.

The run is read from the store once (``read_run``): its workload and fleet
(``infra/clickhouse/replay_export.py``: the requests first arriving in ``[since, until)``), its
engine groups' samples, fitted as ``tokenfleet replay calibrate`` fits them
(``cli/replay_calibrate.py``, on the whole run), the observed figures
(``infra/clickhouse/summary.py``: measured as the simulator measures a run, over the same
requests) and the policy that ran (``run_policy``). Each group of the fleet runs on the profile
fitted to the instances of its model whose heartbeats name its profile (``replay_fleet``). With
``--profiles FILE`` the run is not fitted again: the groups run on the profiles of FILE (as
``replay calibrate --out FILE`` wrote them), found by the same rule. The policies, the one that
ran among them (added when not given), are compared on that fleet and workload as ``simulate``
compares them (``sim/evaluation/compare.py``, under each planner given).

Self error (``self_error``), for the policy that ran (under the ``static`` planner when it is
given, else the first): per figure of ``SELF_ERROR``, (predicted - observed) / observed, signed,
rounded to 4 decimals; None where either figure is missing (a percentile on a request that never
got a first token) or the observed one is 0. It says how far to trust the other policies' figures.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cli.options import first_line, sim_config, write_json
from cli.replay_calibrate import (
    FittedProfiles,
    calibration_entry,
    file_calibration,
    fit_groups,
    fit_lines,
    open_run_store,
    profile_for,
    read_samples,
)

if TYPE_CHECKING:
    from infra.clickhouse.replay_export import RunExport
    from sim.engine.fleet import FleetSpec
    from sim.engine.profiles import ProfileSet

SELF_ERROR = {
    "goodput": "goodput_tokens_per_s",
    "ttft_p50": "ttft_p50_s",
    "ttft_p95": "ttft_p95_s",
    "compliant_share": "compliant_share",
}
"""The ``self_error`` keys and the result figure each compares."""


def relative_error(predicted: object, observed: object) -> float | None:
    """(predicted - observed) / observed, rounded to 4 decimals; None if either is not a number
    or observed is 0."""
    numbers = [isinstance(v, int | float) and not isinstance(v, bool) for v in (predicted, observed)]
    if not all(numbers) or observed == 0:
        return None
    assert isinstance(predicted, int | float) and isinstance(observed, int | float)
    return round((predicted - observed) / observed, 4)


def self_error(predicted: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, float | None]:
    """Each ``SELF_ERROR`` figure's relative error, a result (``predicted``) against the store's."""
    return {key: relative_error(predicted.get(name), observed.get(name)) for key, name in SELF_ERROR.items()}


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a replay reads of a run: its export, its engine groups fitted (None: not fitted), the
    observed figures (a result's keys: the totals, the costs, ``per_class``, ``window_s``) and its
    policy ("": none recorded)."""

    export: RunExport
    fitted: FittedProfiles | None
    observed: dict[str, Any]
    policy: str


def read_run(
    run: str, since_ts: float | None, until_ts: float | None, store_url: str, fit: bool = True
) -> StoredRun:
    """Run ``run`` read from the store at ``store_url``, its engine groups fitted if ``fit``;
    ``ValueError`` (one line) for an unknown run, an empty window, a run without completions
    (when fitted), or a store that fails."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.replay_export import export_run
    from infra.clickhouse.summary import run_policy, summary

    client = open_run_store(store_url)
    try:
        exported = export_run(client, run, since_ts, until_ts)
        fitted = fit_groups(read_samples(client, run)) if fit else None
        figures = summary(client, since_ts, run_id=run, until_ts=until_ts)
        ran = run_policy(client, run)
    except ClickHouseError as exc:
        raise ValueError(f"cannot read the store: {first_line(exc)}") from None
    finally:
        client.close()
    return StoredRun(exported, fitted, observed_figures(figures), ran)


def observed_figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    """The store's ``summary`` with a result's keys: its totals and costs, ``per_class``, ``window_s``."""
    return {
        **figures["total"],
        **figures["cost"],
        "per_class": figures["per_class"],
        "window_s": figures["window_s"],
    }


def replay_fleet(
    run: str, fleet: Mapping[str, Any], profiles: ProfileSet, profiles_file: Path | None = None
) -> FleetSpec:
    """The exported ``fleet`` document on ``profiles``: those fitted to the run
    (``FittedProfiles.profile_set``), or those of ``profiles_file`` (``load_profiles``). Each
    instance group takes the profile fitted to its model and heartbeat profile (``profile_for``),
    else the built-in one its heartbeats name; ``ValueError`` (one line) for a group none
    describes (fitted: its instances heartbeated but completed nothing)."""
    from sim.engine.fleet import fleet_from_doc

    doc = copy.deepcopy(dict(fleet))
    for dc in doc["data_centres"]:
        for group in dc["instances"]:
            model, named = group["model"], group["profile"]
            group["profile"] = profile_for(model, named, profiles)
            if group["profile"] is None and profiles_file is None:
                raise ValueError(
                    f"run {run!r}: the instances of {model} named {named!r} completed "
                    "nothing: no profile was fitted to replay them on"
                )
            if group["profile"] is None:
                raise ValueError(
                    f"{profiles_file} has no profile for the instances of {model} named {named!r} "
                    f"(run {run!r}) and no built-in profile describes them"
                )
    return fleet_from_doc(doc, Path(f"{run}.fleet.yaml"), profiles)


def replay_command(
    run: str,
    policies: Sequence[str],
    planners: Sequence[str] | None,
    since_ts: float | None,
    until_ts: float | None,
    seed: int,
    json_out: str | None,
    store_url: str,
    profiles_file: Path | None = None,
) -> dict[str, Any]:
    """Replay run ``run`` (module docstring; on the profiles of ``profiles_file`` if given, else
    fitted), print the comparison and the self error, write ``json_out`` and return its
    document; the names and the profiles file are checked before the store is opened."""
    from cli.choices import checked_planners, checked_policies
    from sim.engine.profiles import load_profiles
    from sim.evaluation.compare import compare
    from sim.workloads.trace import load_records

    if not run.strip():
        raise ValueError("--run must name a run")
    checked_policies(policies, seed, None)
    shapers = checked_planners(planners)
    loaded = None if profiles_file is None else load_profiles(profiles_file)
    stored = read_run(run, since_ts, until_ts, store_url, fit=loaded is None)
    ran = _known_policy(stored.policy, seed)
    runs = [*policies, *([ran] if ran and ran not in policies else [])]
    if stored.fitted is not None:
        fleet = replay_fleet(run, stored.export.fleet, stored.fitted.profile_set())
        calibration = {fit.name: calibration_entry(fit) for fit in stored.fitted.fits}
        told = [line for fit in stored.fitted.fits for line in fit_lines(fit)]
    else:
        assert loaded is not None and profiles_file is not None
        fleet = replay_fleet(run, stored.export.fleet, loaded, profiles_file)
        calibration = file_calibration(fleet, loaded, profiles_file)
        told = [
            f"the engines' profiles, from {profiles_file} (not fitted again): {', '.join(calibration) or '-'}"
        ]
    workload = load_records(stored.export.records, f"run {run}")
    config = sim_config(seed, 0.25, 0.02, 0.5, None)
    simulated, _ = compare(workload, fleet, runs, config, 1.0, None, None, shapers)
    results = cast(dict[str, Any], simulated["results"])
    ran_key = None
    if ran:  # its result's key: with several planners, under static (else the first)
        ran_key = ran if len(shapers) == 1 else f"{ran}@{'static' if 'static' in shapers else shapers[0]}"
    exported = stored.export
    document = {
        "run": run,
        "policy_ran": stored.policy or None,
        "seed": seed,
        "workload": {
            "requests": len(exported.records),
            "without_hashes": exported.unhashed,
            "left_out": exported.unsized,
        },
        "calibration": calibration,
        "observed": stored.observed,
        "results": results,
        "self_error": None if ran_key is None else self_error(results[ran_key], stored.observed),
    }
    print("\n".join([*_header(document, exported.instances), *told, *replay_lines(document, ran_key)]))
    write_json(json_out, document)
    return document


def _known_policy(name: str, seed: int) -> str:
    """``name`` if the simulator knows it, else "" (and a note on stderr)."""
    from cli.choices import checked_policies

    if not name:
        print("note: the run recorded no policy (run_policy): no self error", file=sys.stderr)
        return ""
    try:
        checked_policies([name], seed, None)
    except ValueError as exc:
        print(
            f"note: the run's policy {name!r} cannot be replayed ({first_line(exc)}): no self error",
            file=sys.stderr,
        )
        return ""
    return name


def _header(document: Mapping[str, Any], instances: int) -> list[str]:
    counts = document["workload"]
    left_out = f", {counts['left_out']} left out (prompt size unknown)" if counts["left_out"] else ""
    return [
        f"run {document['run']}: {counts['requests']} requests ({counts['without_hashes']} without block "
        f"hashes: replayed without prefix reuse{left_out}), {instances} instances; the policy that ran: "
        f"{document['policy_ran'] or 'unknown'}"
    ]


def replay_lines(document: Mapping[str, Any], ran_key: str | None) -> list[str]:
    """Per policy: goodput, compliant share (all, per class), TTFT p50 / p95 and cost per million
    compliant tokens; then the policy that ran, predicted beside observed with the error."""
    results: Mapping[str, Mapping[str, Any]] = document["results"]
    observed = document["observed"]
    classes = sorted({c for r in (*results.values(), observed) for c in r.get("per_class", {})})
    head = ["policy", "goodput tok/s", "compliant", *classes, "TTFT p50 s", "TTFT p95 s", "$/M compliant"]

    def row(name: str, r: Mapping[str, Any]) -> list[str]:
        shares = [_cell(r.get("per_class", {}).get(c, {}).get("compliant_share"), "{:.1%}") for c in classes]
        return [
            name,
            _cell(r.get("goodput_tokens_per_s"), "{:.1f}"),
            _cell(r.get("compliant_share"), "{:.1%}"),
            *shares,
            _cell(r.get("ttft_p50_s"), "{:.3f}"),
            _cell(r.get("ttft_p95_s"), "{:.3f}"),
            _cell(r.get("cost_per_million_goodput_tokens"), "{:.2f}"),
        ]

    lines = ["", "replayed (compliant: share of output tokens within the class's objective):"]
    lines += _aligned([head, *(row(name, r) for name, r in results.items()), row("observed", observed)])
    if ran_key is not None:
        errors = document["self_error"]
        lines += ["", f"{ran_key}, the policy that ran: predicted beside observed"]
        table = [["figure", "predicted", "observed", "error"]]
        for key, name in SELF_ERROR.items():
            fmt = _FORMATS[key]
            error = _cell(errors[key], "{:+.1%}")
            table.append([key, _cell(results[ran_key].get(name), fmt), _cell(observed.get(name), fmt), error])
        lines += _aligned(table)
    return lines


_FORMATS = {"goodput": "{:.1f}", "ttft_p50": "{:.3f}", "ttft_p95": "{:.3f}", "compliant_share": "{:.1%}"}


def _cell(value: object, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _aligned(rows: list[list[str]]) -> list[str]:
    """The rows as columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
