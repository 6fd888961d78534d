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

Draws. The simulator draws the engines' noise (the fitted ``noise_sigma`` per step and
``token_delay_sigma`` per attempt) and its other random choices from ``--seed``; ``--draws N``
replays every policy under seeds ``seed`` to ``seed + N - 1``. ``results`` are the first
draw's; ``draws`` gives, per policy, the median, min and max of each figure of
``cli/replay_report.py``'s ``DRAWN`` over the N draws.

Self error (``self_error``), for the policy that ran (under the ``static`` planner when it is
given, else the first): per figure of ``SELF_ERROR`` (``cli/replay_report.py``), (predicted -
observed) / observed, signed, rounded to 4 decimals, predicted = the draws' median when N > 1;
None where either figure is missing (a percentile on a request that never got a first token) or
the observed one is 0. It says how far to trust the other policies' figures.
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
from cli.replay_report import draw_figures, header, predicted, replay_lines, self_error

if TYPE_CHECKING:
    from infra.clickhouse.replay_export import RunExport
    from sim.engine.fleet import FleetSpec
    from sim.engine.profiles import ProfileSet


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
    draws: int = 1,
) -> dict[str, Any]:
    """Replay run ``run`` (module docstring; on the profiles of ``profiles_file`` if given, else
    fitted; ``draws`` seeds from ``seed``), print the comparison and the self error, write
    ``json_out`` and return its document; the names, the draws and the profiles file are checked
    before the store is opened."""
    from cli.choices import checked_planners, checked_policies
    from sim.engine.profiles import load_profiles
    from sim.evaluation.compare import compare
    from sim.workloads.trace import load_records

    if not run.strip():
        raise ValueError("--run must name a run")
    if draws < 1:
        raise ValueError(f"--draws must be at least 1, not {draws}")
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
    drawn = []
    for draw_seed in range(seed, seed + draws):
        config = sim_config(draw_seed, 0.25, 0.02, 0.5, None)
        simulated, _ = compare(workload, fleet, runs, config, 1.0, None, None, shapers)
        drawn.append(cast(dict[str, Any], simulated["results"]))
    ran_key = None
    if ran:  # its result's key: with several planners, under static (else the first)
        ran_key = ran if len(shapers) == 1 else f"{ran}@{'static' if 'static' in shapers else shapers[0]}"
    exported = stored.export
    document: dict[str, Any] = {
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
        "results": drawn[0],
    }
    if draws > 1:
        document["draws"] = {"seeds": list(range(seed, seed + draws)), "figures": draw_figures(drawn)}
    document["self_error"] = (
        None if ran_key is None else self_error(predicted(document)[ran_key], stored.observed)
    )
    print("\n".join([*header(document, exported.instances), *told, *replay_lines(document, ran_key)]))
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
