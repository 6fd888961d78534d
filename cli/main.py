"""``tokenfleet`` command line: the composition root that wires workloads, fleets and policies.

The commands live by job: ``cli.simulator`` (simulate, capacity, tail, report, generate),
``cli.service`` (worker, fleet, gateway, planner), ``cli.traffic`` (loadgen, batch), ``cli.store`` (sql,
db, slomax, schemas), ``cli.up`` (up, status, down); ``cli.options`` holds what they share.
This module registers them on the typer ``app`` and runs it (``main``). Every command runs
from the installed wheel alone: the command line never imports the lab (the demo is
``python -m lab.demo_cli``).

Errors in what the user passed (unknown flag or policy, bad fleet, unreadable trace or policy
config, a number out of range, NaN or infinite) print one line naming the problem and exit
with status 2. Commands import what they need when they run, so start-up (and ``--help``)
stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated

import typer

try:  # recent typer carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from cli import replay, service, simulator, store, traffic, up
from cli.options import error

app = typer.Typer(
    name="tokenfleet",
    help="TokenFleet LLM fleet scheduler\n\n\b\nExample:\n"
    "  tokenfleet simulate --workload synthetic:duration_s=60 --policy tokenpilot",
    add_completion=False,
    rich_markup_mode=None,  # plain click help and errors: main() prints errors as one line
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # the commands' contexts inherit it
)
# In this order in --help (the groups come after the commands).
for name, command in (
    ("simulate", simulator.simulate),
    ("capacity", simulator.capacity),
    ("tail", simulator.tail),
    ("report", simulator.report),
    ("generate", simulator.generate),
    ("worker", service.worker),
    ("fleet", service.fleet_command),
    ("gateway", service.gateway),
    ("planner", service.planner),
    ("loadgen", traffic.loadgen),
    ("sql", store.sql),
    ("up", up.up),
    ("status", up.status),
    ("down", up.down),
):
    app.command(name)(command)
app.add_typer(traffic.batch_app, name="batch")
app.add_typer(store.schemas_app, name="schemas")
app.add_typer(store.db_app, name="db")
app.add_typer(store.slomax_app, name="slomax")
app.add_typer(replay.replay_app, name="replay")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"tokenfleet {version('tokenfleet')}")
        raise typer.Exit()


@app.callback()
def _tokenfleet(
    show_version: Annotated[
        bool,
        typer.Option("--version", help="Show the version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the process arguments) and return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        # standalone_mode=False: click raises its errors instead of printing usage and a box.
        result = command.main(args, prog_name="tokenfleet", standalone_mode=False)
    except ClickException as exc:
        ctx = exc.ctx if isinstance(exc, UsageError) else None
        error(ctx.command_path if ctx is not None else "tokenfleet", exc.format_message())
        return exc.exit_code
    except (ValueError, KeyError, OSError) as exc:
        # The top-level group's only option (--version) exits, so args[0] is the command that
        # failed, and args[1] the subcommand of a group (batch submit, db migrate) unless it is
        # an option: then the group ran its own command (replay --run RUN).
        groups = {info.name for info in app.registered_groups}
        group = args[0] in groups and len(args) > 1 and not args[1].startswith("-")
        error(f"tokenfleet {' '.join(args[:2] if group else args[:1])}", str(exc))
        return 2
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
