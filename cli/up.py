"""``tokenfleet up``, ``status`` and ``down``: a whole TokenFleet on this machine, supervised
(the ``local`` package does the work)."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.options import MAX_SECONDS, POLICY_HELP, KvConnectorOpt, error, load_settings, real, whole

PRODUCT_POLICY = "slomax+tokenpilot"  # local.plan.PRODUCT_POLICY, not imported: -h stays fast
FOLLOWED = ("loading", "draining", "stopping", "standby")  # server states a planner wants (local/follower.py)

DirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        metavar="DIR",
        help="the stack's directory: its state, logs, inventory and API key (default: "
        "TOKENFLEET_DATA_DIR/up, i.e. .tokenfleet/up)",
    ),
]


class Engines(StrEnum):
    inventory = "inventory"
    local = "local"
    emulated = "emulated"


def _directory(directory: Path | None, settings: Any) -> Path:
    return (directory or settings.data_dir / "up").resolve()


def up(
    engines: Annotated[
        Engines,
        typer.Option(
            "--engines",
            help="inventory: the vLLM servers of --inventory (or TOKENFLEET_INVENTORY); local: start "
            "vLLM CPU servers here (`make engine` first); emulated: start emulated vLLM servers here "
            "(the simulator's engine model behind vLLM's API; no vLLM needed)",
        ),
    ] = Engines.inventory,
    inventory: Annotated[
        Path | None,
        typer.Option("--inventory", metavar="FILE", help="--engines inventory: the engines' inventory YAML"),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            metavar="DIR",
            help="--engines local: a model directory (its weights if it has any, else random ones); "
            "default: the tiny test model",
        ),
    ] = None,
    servers: Annotated[
        int | None,
        typer.Option(
            "--servers",
            metavar="N",
            help="--engines local or emulated: how many servers (default 2; emulated: of llama3-8b-h100)",
            callback=whole(1, 16),
        ),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="SPEC",
            help="--engines emulated, instead of --servers: the emulated servers and their engine profiles, "
            "COUNTxPROFILE[+...] or a fleet YAML file (one server per instance)",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"routing policy (default: TOKENFLEET_POLICY if set, else {PRODUCT_POLICY}, the product): "
            f"{POLICY_HELP}",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", metavar="ADDR", help="the gateway's address")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port", metavar="N", help="the gateway's port (0: any free one)", callback=whole(0, 65535)
        ),
    ] = 8000,
    gateways: Annotated[
        int,
        typer.Option(
            "--gateways",
            metavar="N",
            help="gateway processes sharing --port: one that dies takes only its own calls",
            callback=whole(1, 8),
        ),
    ] = 2,
    directory: DirOpt = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="S",
            help="every part ready within S seconds, or everything is stopped",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = 300.0,
    foreground: Annotated[
        bool, typer.Option("--foreground", help="stay attached; Ctrl-C stops the stack")
    ] = False,
    wait_for_broker: Annotated[
        bool,
        typer.Option(
            "--wait-for-broker",
            help="with TOKENFLEET_KAFKA_BOOTSTRAP: start even if the broker does not answer yet, and wait "
            "for it (up to --timeout)",
        ),
    ] = False,
    planner: Annotated[
        str | None,
        typer.Option(
            "--planner", metavar="NAME", help="run this planner and follow its plans (hpa, fleetmind, ...)"
        ),
    ] = None,
    max_servers: Annotated[
        int | None,
        typer.Option(
            "--max-servers", metavar="N", help="with --planner: at most N servers", callback=whole(1, 16)
        ),
    ] = None,
    planner_interval: Annotated[
        float | None,
        typer.Option(
            "--planner-interval",
            metavar="S",
            help="with --planner: plan every S s",
            callback=real(0.0, 3600.0),
        ),
    ] = None,
    planner_param: Annotated[
        list[str] | None,
        typer.Option("--planner-param", metavar="NAME=VALUE", help="with --planner: passed on (repeatable)"),
    ] = None,
    load_s: Annotated[
        float | None,
        typer.Option("--load-s", metavar="S", help="emulated: servers load S s", callback=real(0.0, 3600.0)),
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            "--max-num-seqs", metavar="N", help="calls a server runs at once", callback=whole(1, 100_000)
        ),
    ] = None,
    kv_connector: KvConnectorOpt = None,
) -> None:
    """Start the broker, worker, dispatcher and gateway (and local engine servers) here, supervised.

    Returns once every part is ready and prints every address, an API key and the openai
    snippet; the stack keeps running until `tokenfleet down`.

    With --planner it also runs that planner and follows its plans: servers start, drain and stop
    (`tokenfleet status` shows each loading, ready, draining or standby).

    \b
    Example:
      tokenfleet up --engines local --servers 2 --port 8000
      tokenfleet up --engines emulated --servers 2 --policy slomax+tokenpilot
      tokenfleet up --engines local --servers 1 --max-servers 3 --planner fleetmind
    """
    from local import UpFailed, UpOptions
    from local import up as start
    from local.report import show

    _only(engines, (Engines.local,), model=model)
    _only(engines, (Engines.inventory,), inventory=inventory)
    _only(engines, (Engines.emulated,), fleet=fleet, load_s=load_s)
    ours = dict(servers=servers, planner=planner, max_num_seqs=max_num_seqs, kv_connector=kv_connector)
    _only(engines, (Engines.local, Engines.emulated), **ours)  # the options of servers the stack starts
    settings = load_settings(policy)
    options = UpOptions(
        dir=_directory(directory, settings),
        engines=engines.value,
        inventory=inventory,
        model=model,
        servers=servers,
        fleet=fleet,
        policy=policy,
        host=host,
        port=port,
        gateways=gateways,
        timeout_s=timeout,
        planner=planner,
        max_servers=max_servers,
        planner_interval_s=planner_interval,
        planner_params=tuple(planner_param or ()),
        load_s=load_s,
        max_num_seqs=max_num_seqs,
        kv_connector=kv_connector,
    )
    if inventory is not None and not inventory.is_file():
        raise ValueError(f"--inventory {inventory}: no such file")
    if settings.kafka_bootstrap:
        _broker_answers(settings, wait_for_broker)
    try:
        state = start(options, settings, foreground=foreground, on_ready=show)
    except UpFailed as exc:
        error("tokenfleet up", str(exc))
        raise typer.Exit(1) from None
    if not foreground:
        show(state)


def _broker_answers(settings: Any, wait: bool) -> None:
    """A configured broker that does not answer within seconds is one line (exit 2), not minutes of
    "worker starting": unless ``wait`` (``--wait-for-broker``), then it is said once."""
    from infra.kafka.broker import BrokerUnreachable, require_reachable
    from infra.kafka.connection import KafkaConnection

    try:
        require_reachable(KafkaConnection.from_settings(settings))
    except BrokerUnreachable as exc:
        if not wait:
            raise BrokerUnreachable(
                f"{exc}: start it, or pass --wait-for-broker to start the stack and wait for it"
            ) from None
        print(f"up: {exc}; waiting for it (--wait-for-broker)", file=sys.stderr, flush=True)


def _only(engines: Engines, modes: tuple[Engines, ...], **given: object) -> None:
    for name, value in given.items():
        if value is not None and engines not in modes:
            allowed = " or ".join(mode.value for mode in modes)
            raise typer.BadParameter(
                f"only with --engines {allowed}", param_hint=f"--{name.replace('_', '-')}"
            )


def status(directory: DirOpt = None) -> None:
    """Show the stack `tokenfleet up` started: each part's state, restarts, pid, address and log.

    Exit status 0 when the supervisor and every part run and each part is ready (a planned
    stack's servers: or loading, draining, stopping, standby, as its planner wants them), 1
    otherwise.

    \b
    Example:
      tokenfleet status --dir .tokenfleet/up
    """
    from local import refresh
    from local.report import show

    where = _directory(directory, load_settings())
    found = refresh(where)
    if found is None:
        raise ValueError(f"no stack in {where} (start one with `tokenfleet up`)")
    state, now = found
    show(state, now)
    fine = {"ready", *FOLLOWED}
    ours = [part.name for part in state.parts if part.kind != "engine"]
    if state.phase != "ready" or not all(now[name] in fine for name in ours):
        raise typer.Exit(1)


def down(
    directory: DirOpt = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="S",
            help="wait S seconds for the supervisor's orderly stop, then stop what is left",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = 120.0,
) -> None:
    """Stop everything `tokenfleet up` started in the directory; no process of it is left.

    \b
    Example:
      tokenfleet down --dir .tokenfleet/up
    """
    from local import down as stop

    where = _directory(directory, load_settings())
    running, left = stop(where, timeout)
    if not running:
        print(f"nothing runs in {where}")
    elif left:
        error("tokenfleet down", f"processes of the stack still run after the stop: {left}")
        raise typer.Exit(1)
    else:
        print(f"stopped the stack in {where} ({len(running)} processes); none of it left")
