"""``tokenfleet replay``: a run's traffic, read back from the store, as the simulator's input.

``replay --run RUN --policy P [--policy Q ...]`` (the group's own command, ``cli/replay_run.py``)
replays the run on its engines, calibrated, under each policy, beside what the store recorded;
with ``--profiles FILE`` on the profiles ``replay calibrate --out FILE`` wrote, not fitted again.
``replay export`` writes the run's workload (Mooncake JSONL) and the fleet that served it (fleet
YAML), read by ``infra/clickhouse/replay_export.py``; ``replay calibrate`` fits its engines'
profiles (``cli/replay_calibrate.py``). Without ``--run`` or a subcommand the group says what to
give and exits 2.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from cli import replay_calibrate
from cli.choices import PlannerOpt
from cli.options import JsonOpt, SeedOpt, error, first_line, load_settings

replay_app = typer.Typer(
    help="replay a run's traffic from the store\n\n"
    "tokenfleet replay --run RUN --policy P [--policy Q ...] replays the run on its engines, "
    "calibrated, under each policy (and the one that ran), beside what the store recorded of it; "
    "with --profiles FILE, on the profiles 'replay calibrate --out FILE' wrote (the run is not "
    "fitted again). The subcommands export its workload and fleet, and fit its engines' profiles.\n\n"
    "\b\nExample:\n"
    "  tokenfleet replay --run RUN --policy tokenpilot --json out/replay.json\n"
    "  tokenfleet replay calibrate --run RUN --out out/replay/profiles.yaml\n"
    "  tokenfleet replay --run RUN --profiles out/replay/profiles.yaml --policy tokenpilot",
    rich_markup_mode=None,
)

NO_SUBCOMMAND = "replay: give a subcommand (export, calibrate) or --run"

replay_app.command("calibrate")(replay_calibrate.calibrate)

SinceOpt = Annotated[
    str | None,
    typer.Option(
        "--since", metavar="T", help="only requests arriving at or after T (Unix s or ISO 8601, UTC)"
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", metavar="T", help="only requests arriving before T (Unix s or ISO 8601, UTC)"),
]
ReplayProfilesOpt = Annotated[
    Path | None,
    typer.Option(
        "--profiles",
        metavar="FILE",
        help="replay on the engine profiles of FILE, as 'replay calibrate --out FILE' wrote them, "
        "instead of fitting the run's engines again",
    ),
]

DrawsOpt = Annotated[
    int,
    typer.Option(
        "--draws",
        metavar="N",
        help="replay each policy N times, seeds --seed to --seed + N - 1 (the engines' noise): the "
        "figures' median and range, and the self error from the medians",
    ),
]


@replay_app.callback(invoke_without_command=True)
def replay(
    ctx: typer.Context,
    run: Annotated[
        str | None, typer.Option("--run", metavar="RUN", help="replay this run (its run_id) under --policy")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help="a policy to replay the run under; repeat to compare (the one that ran is added)",
        ),
    ] = None,
    planner: PlannerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    profiles: ReplayProfilesOpt = None,
    seed: SeedOpt = 0,
    draws: DrawsOpt = 1,
    json_out: JsonOpt = None,
) -> None:
    if ctx.invoked_subcommand is not None:
        if run is not None or policy or planner or since or until or profiles or json_out or draws != 1:
            error(
                "tokenfleet replay",
                f"give --run and its options to the replay or to {ctx.invoked_subcommand}",
            )
            raise typer.Exit(2)
        return
    if run is None:
        print(NO_SUBCOMMAND, file=sys.stderr)
        raise typer.Exit(2)
    if not policy:
        raise typer.BadParameter("give at least one --policy", param_hint="'--policy'")
    from cli.replay_run import replay_command

    since_ts, until_ts = window(since, until)
    store_url = load_settings().clickhouse_url
    replay_command(run, policy, planner, since_ts, until_ts, seed, json_out, store_url, profiles, draws)


def window(since: str | None, until: str | None) -> tuple[float | None, float | None]:
    """``--since`` and ``--until`` as Unix seconds (None: not given); ``ValueError`` for a bad
    time or an empty window."""
    since_ts = None if since is None else parse_time(since, "--since")
    until_ts = None if until is None else parse_time(until, "--until")
    if since_ts is not None and until_ts is not None and since_ts >= until_ts:
        raise ValueError("--since must be before --until")
    return since_ts, until_ts


def parse_time(text: str, option: str) -> float:
    """``text`` as Unix seconds: a number of seconds, or an ISO 8601 time (UTC unless it names an
    offset: ``2026-05-01T12:00:00``, ``2026-05-01 12:00:00+02:00``). ``ValueError`` names ``option``."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(
                f"{option} {text[:64]!r} is not a time: give Unix seconds or ISO 8601 (2026-05-01T12:00:00)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
    if not 0 <= seconds < 1e11:  # NaN and infinities too
        raise ValueError(f"{option} {text[:64]!r} is not a time after 1970")
    return seconds


@replay_app.command("export")
def export(
    run: Annotated[str, typer.Option("--run", metavar="RUN", help="the run_id of the run to export")],
    out: Annotated[
        str, typer.Option("--out", metavar="DIR", help="writes DIR/workload.jsonl, DIR/fleet.yaml")
    ],
    since: SinceOpt = None,
    until: UntilOpt = None,
) -> None:
    """Write a run's requests as a Mooncake workload (one record per request, at its first arrival;
    hashes of prompt blocks only) and the instances that served it as a fleet YAML; print one line.

    \b
    Example:
      tokenfleet replay export --run tokenfleet-20260501T120000Z --since 2026-05-01T12:00:00 --out out/replay
    """
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from cli.store import open_store
    from infra.clickhouse.migrate import migrate
    from infra.clickhouse.replay_export import export_run
    from infra.files import write_atomic

    if not run.strip():
        raise ValueError("--run must name a run")
    since_ts, until_ts = window(since, until)
    client = open_store(load_settings().clickhouse_url)
    try:
        migrate(client)  # an older store gains the replay's columns (its rows: no hashes)
        exported = export_run(client, run, since_ts, until_ts)
    except ClickHouseError as exc:
        raise ValueError(f"cannot read the store: {first_line(exc)}") from None
    finally:
        client.close()
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    workload, fleet = directory / "workload.jsonl", directory / "fleet.yaml"
    write_atomic(workload, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in exported.records))
    write_atomic(fleet, _fleet_yaml(run, exported.fleet))
    left_out = f", {exported.unsized} left out (prompt size unknown)" if exported.unsized else ""
    print(
        f"run {run}: {len(exported.records)} requests ({exported.unhashed} without block hashes: "
        f"replayed without prefix reuse{left_out}), {exported.instances} instances -> {workload}, {fleet}"
    )


def _fleet_yaml(run: str, doc: dict[str, object]) -> str:
    import yaml

    header = (
        f"# The instances that heartbeated in run {run} (tokenfleet replay export), each as its last\n"
        "# heartbeat describes it. gpus: per instance, informative (the profile sets what the\n"
        "# simulator counts); price_per_hour null: the instances had no price.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
