"""``tokenfleet replay calibrate``: fit each engine group's step-time law to what the store
recorded of a run (``sim/engine/calibration.py``, from the samples of
``infra/clickhouse/calibration_samples.py``), print the fit per group and write the profiles file
``simulate --profiles`` and ``replay`` read.

A group's profile is named as its heartbeats name it (the name ``replay export``'s fleet file
gives its instances), so that file and this one replay together; a name several models share is
written once per model as ``NAME@MODEL`` (``profile_name``; ``profile_for`` finds a group's
profile again by that rule, in a fit or in this file). The prior of a fit (the value of each term
the data do not pin) is the built-in profile of that name; for a name the simulator does not know
(a real engine's), a built-in profile of the same model, else ``llama3-8b-h100``, its law scaled
to the observed decode steps (``rescaled``). ``calibration_entry`` and ``file_calibration`` say,
in a replay's JSON, what its engines' profiles are and where they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.options import first_line, load_settings

if TYPE_CHECKING:
    from infra.clickhouse.calibration_samples import GroupSamples
    from sim.engine.calibration import Calibration
    from sim.engine.fleet import FleetSpec
    from sim.engine.profiles import EngineProfile, ProfileSet

DEFAULT_PRIOR = "llama3-8b-h100"


def calibrate(
    run: Annotated[str, typer.Option("--run", metavar="RUN", help="the run_id of the run to calibrate on")],
    out: Annotated[str, typer.Option("--out", metavar="FILE", help="the profiles YAML to write")],
) -> None:
    """Fit each engine group's step-time law to a run's TTFT and TPOT (least squares), print the
    fit and its residual error per group, and write the profiles for simulate --profiles.

    \b
    Example:
      tokenfleet replay calibrate --run tokenfleet-20260501T120000Z --out out/replay/profiles.yaml
    """
    calibrate_command(run, Path(out), load_settings().clickhouse_url)


def calibrate_command(run: str, out: Path, store_url: str) -> None:
    """Read run ``run``'s samples from the store at ``store_url``, fit every engine group, print
    each fit and write ``out``; ``ValueError`` (one line, exit 2) for no such run or no store."""
    from infra.files import write_atomic
    from sim.engine.profiles import profiles_text

    if not run.strip():
        raise ValueError("--run must name a run")
    client = open_run_store(store_url)
    try:
        fitted = fit_groups(read_samples(client, run))
    finally:
        client.close()
    for group_fit in fitted.fits:
        print("\n".join(fit_lines(group_fit)))
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Engine profiles fitted to run {run} (tokenfleet replay calibrate).\n"
    write_atomic(out, header + profiles_text(fitted.profiles, fitted.models))
    count = len(fitted.profiles)
    print(f"wrote {out} ({count} profile{'s' * (count != 1)}): simulate with --profiles {out}")


def open_run_store(store_url: str) -> Any:
    """A client on the store at ``store_url``, migrated (a fresh or older store gains the tables
    and columns a replay reads, and holds nothing of the run); one line for a store that fails."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from cli.store import open_store
    from infra.clickhouse.migrate import migrate

    client = open_store(store_url)
    try:
        migrate(client)
    except ClickHouseError as exc:
        client.close()
        raise ValueError(f"cannot read the store: {first_line(exc)}") from None
    return client


def read_samples(client: Any, run: str) -> list[GroupSamples]:
    """Run ``run``'s engine groups (``calibration_samples``); ``ValueError`` when it has no
    completions or the store fails."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.calibration_samples import calibration_samples

    try:
        groups = calibration_samples(client, run)
    except ClickHouseError as exc:
        raise ValueError(f"cannot read the store: {first_line(exc)}") from None
    if not groups:
        raise ValueError(f"run {run!r} has no completions in the store: nothing to calibrate on")
    return groups


@dataclass(frozen=True, slots=True)
class GroupFit:
    """One engine group's samples, the profile name it is fitted under, and the fit."""

    group: GroupSamples
    name: str
    fit: Calibration


@dataclass(frozen=True, slots=True)
class FittedProfiles:
    """Every engine group's fit (``fit_groups``), and the fitted profiles by name."""

    fits: tuple[GroupFit, ...]

    @property
    def profiles(self) -> dict[str, EngineProfile]:
        return {f.name: f.fit.profile for f in self.fits}

    @property
    def models(self) -> dict[str, str]:
        return {f.name: f.group.model for f in self.fits}

    def profile_set(self) -> ProfileSet:
        """The built-in profiles joined with the fitted ones (one of the same name replaces the
        built-in one), as ``load_profiles`` joins a profiles file."""
        from sim.engine.profiles import BUILT_IN, ProfileSet

        return ProfileSet({**BUILT_IN.profiles, **self.profiles}, {**BUILT_IN.models, **self.models})


def fit_groups(groups: list[GroupSamples]) -> FittedProfiles:
    """Each group's step-time law fitted (module docstring), under its profile name."""
    names = _profile_names(groups)
    return FittedProfiles(tuple(GroupFit(g, n, _fit(g, n)) for g, n in zip(groups, names, strict=True)))


def profile_name(model: str, profile: str, shared: bool) -> str:
    """The name a fit gives the profile of the instances of ``model`` whose heartbeats name
    ``profile``: that name (the model's when they named none), as ``NAME@MODEL`` when ``shared``
    (the groups of several models have that name)."""
    name = profile or model
    return f"{name}@{model}" if shared else name


def _profile_names(groups: list[GroupSamples]) -> list[str]:
    """Each group's profile name (``profile_name``)."""
    names = [profile_name(g.model, g.profile, False) for g in groups]
    return [profile_name(g.model, g.profile, names.count(n) > 1) for n, g in zip(names, groups, strict=True)]


def profile_for(model: str, profile: str, profiles: ProfileSet) -> str | None:
    """The name, among ``profiles``, of the profile a fit named for the instances of ``model``
    whose heartbeats name ``profile`` (``profile_name``): ``NAME@MODEL`` if ``profiles`` holds
    one, else ``NAME``; None if it holds neither. On the profiles of ``fit_groups``
    (``FittedProfiles.profile_set``) or of the file ``calibrate`` wrote of them alike."""
    names = (profile_name(model, profile, True), profile_name(model, profile, False))
    return next((name for name in names if name in profiles.profiles), None)


def _fit(group: GroupSamples, name: str) -> Calibration:
    from sim.engine import calibration
    from sim.engine.profiles import PROFILE_MODELS, PROFILES

    observations = calibration.Observations.of(**group.completions)
    beats = calibration.HeartbeatSummary(
        kv_blocks_total=group.kv_blocks_total,
        max_running=group.max_running,
        beats_at_seat_limit=group.beats_at_seat_limit,
        kv_block_tokens=group.kv_block_tokens,
        beats_waiting_at_most=group.beats_waiting_at_most,
        max_seqs=group.max_seqs,
        prefill_budget_tokens=group.prefill_budget_tokens,
    )
    prior = PROFILES.get(group.profile)
    notes = []
    if prior is None:
        same_model = [p for p, model in PROFILE_MODELS.items() if model == group.model]
        base = PROFILES[same_model[0] if same_model else DEFAULT_PRIOR]
        prior = calibration.rescaled(base, observations)
        factor = prior.t0_s / base.t0_s
        notes.append(
            f"no built-in profile {group.profile or '(none)'!r}: the prior is {base.name}'s law "
            f"x{factor:.3g} (scaled to the observed decode steps)"
        )
    if group.kv_blocks_total > 0:  # what the heartbeats said of the instances
        prior = replace(prior, gpus=group.gpus, price_per_hour=group.price_per_hour)
    fit = calibration.calibrate(observations, prior, beats, name=name)
    return replace(fit, messages=(*notes, *fit.messages))


def fit_lines(group_fit: GroupFit) -> list[str]:
    """What the command prints of one group's fit."""
    from sim.engine.calibration import UNKNOWNS

    group, fit = group_fit.group, group_fit.fit
    profile = fit.profile
    instances = len(group.instances)
    lines = [
        f"{group.model} / {group.profile or '(no profile)'} -> {profile.name}: {instances} instance"
        f"{'s' * (instances != 1)}, {group.attempts} attempts "
        f"({fit.ttft_rows} TTFT rows, {fit.tpot_rows} TPOT rows)",
        "  " + "  ".join(f"{term} {getattr(profile, term):.4g}" for term in UNKNOWNS),
        f"  attention_growth_tokens {profile.attention_growth_tokens:.0f}  "
        f"noise_sigma {profile.noise_sigma:.3g}  token_delay_sigma {profile.token_delay_sigma:.3g}  "
        f"kv_tokens {profile.kv_tokens}  "
        f"max_seqs {profile.max_seqs}  gpus {profile.gpus}  price_per_hour {profile.price_per_hour}",
        f"  residual error (relative RMS): TTFT {_share(fit.ttft_error)} "
        f"(prior {_share(fit.prior_ttft_error)}), "
        f"TPOT {_share(fit.tpot_error)} (prior {_share(fit.prior_tpot_error)})",
    ]
    return lines + [f"  note: {message}" for message in fit.messages]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def calibration_entry(group_fit: GroupFit) -> dict[str, Any]:
    """One group's fit for the JSON: its parameters, residual errors, and the terms kept at the
    prior's value with why."""
    from sim.engine.calibration import MIN_ROWS

    group, fit = group_fit.group, group_fit.fit
    too_few = f"too few rows to fit (at least {MIN_ROWS} TTFT and {MIN_ROWS} TPOT rows)"

    def why(term: str) -> str:
        return next((m.split(": ", 1)[1] for m in fit.messages if m.startswith(f"{term}: ")), too_few)

    return {
        "model": group.model,
        "heartbeat_profile": group.profile,
        "instances": len(group.instances),
        "attempts": group.attempts,
        "rows": {"ttft": fit.ttft_rows, "tpot": fit.tpot_rows},
        "parameters": _parameters(fit.profile),
        "residual_error": {
            "ttft": fit.ttft_error,
            "tpot": fit.tpot_error,
            "prior_ttft": fit.prior_ttft_error,
            "prior_tpot": fit.prior_tpot_error,
        },
        "kept_at_prior": {term: why(term) for term in fit.kept},
        "notes": list(fit.messages),
    }


def file_calibration(fleet: FleetSpec, profiles: ProfileSet, path: Path) -> dict[str, Any]:
    """Per profile of the file ``path`` the ``fleet`` runs on (not a built-in one its heartbeats
    named): ``profiles_file`` (``path``), its ``model`` and ``parameters`` (``calibration_entry``'s)."""
    from sim.engine.profiles import PROFILES

    # load_profiles builds a new profile for every entry of the file: built-in ones stay as they are.
    used = {
        s.profile.name: s.profile for s in fleet.instances if s.profile is not PROFILES.get(s.profile.name)
    }
    return {
        name: {
            "profiles_file": str(path),
            "model": profiles.model_of(profile),
            "parameters": _parameters(profile),
        }
        for name, profile in used.items()
    }


def _parameters(profile: EngineProfile) -> dict[str, Any]:
    """The law's terms and the capacity of ``profile``, as the JSON's ``parameters``."""
    from sim.engine.calibration import UNKNOWNS

    capacity = ("kv_tokens", "kv_block_tokens", "max_seqs", "gpus", "price_per_hour")
    law = (*UNKNOWNS, "attention_growth_tokens", "noise_sigma", "token_delay_sigma")
    return {name: getattr(profile, name) for name in (*law, *capacity)}
