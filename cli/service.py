"""The service commands: the deployables (``worker``, ``fleet``, ``gateway``, ``planner``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.options import (
    DEFAULT_FLEET,
    FLEET_HELP,
    INVENTORY_HELP,
    MAX_SECONDS,
    POLICY_HELP,
    LogLevel,
    load_settings,
    real,
    require_broker,
    whole,
)


def worker(
    policy: Annotated[
        str | None, typer.Option("--policy", metavar="NAME", help=f"routing policy: {POLICY_HELP}")
    ] = None,
    loglevel: Annotated[LogLevel, typer.Option("--loglevel")] = LogLevel.warn,
) -> None:
    """Run the streaming scheduler (Faust worker).

    \b
    Example:
      tokenfleet worker --policy tokenpilot --loglevel info
    """
    from worker.scheduling import policy_params
    from worker.supervisor import run_worker

    settings = load_settings(policy)
    policy_params(settings)  # a bad fleet rules file is a one-line error here, not a restart loop
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run_worker(settings, loglevel=loglevel.value)


def fleet_command(
    fleet: Annotated[str, typer.Option("--fleet", metavar="SPEC", help=FLEET_HELP)] = DEFAULT_FLEET,
    speed: Annotated[
        float,
        typer.Option(
            "--speed",
            metavar="X",
            help="emulated time runs X times faster, X in [0.001, 1e6]",
            callback=real(0.001, 1e6, low_open=False),
        ),
    ] = 1.0,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            metavar="KIND",
            help="emulated (the simulator's engine model, --fleet) or vllm (the real servers of --inventory)",
        ),
    ] = "emulated",
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", metavar="FILE", help=INVENTORY_HELP),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            metavar="PATH",
            help="emulated: the workload the load generator replays, for its answers' lengths "
            "(without it every request generates its whole max_tokens budget)",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="of a synthetic --workload")] = 0,
) -> None:
    """The dispatcher: execute routing decisions on emulated instances or real vLLM servers.

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet fleet --fleet 2xllama3-8b-h100 --speed 10
    """
    from dispatcher.main import serve
    from infra.kafka.bus import kafka_connection

    settings = load_settings()
    engines: Any = fleet
    lengths = None
    if workload is not None:
        from sim.workloads.sources import open_workload
        from traffic.loadgen import workload_output_tokens

        lengths = workload_output_tokens(open_workload(workload, seed=seed))
    if engine == "vllm":
        from dispatcher.engines.vllm.adapter import VllmEngines

        engines = VllmEngines(
            _inventory(inventory, settings),
            scrape_s=settings.scrape_interval_s,
            source=Path(inventory or settings.inventory),  # followed: engines added, drained
        )
    elif engine == "emulated":
        from sim.engine.fleet import parse_fleet

        parse_fleet(fleet)  # fail fast on a bad spec
    else:
        raise ValueError(f"--engine must be emulated or vllm, not {engine!r}")
    require_broker(settings, embedded=None)  # never a private broker no worker can reach
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with kafka_connection(settings) as connection:
        counts = _run_until_interrupted(
            serve(settings, connection, engines, speed=speed, output_tokens=lengths)
        )
    print(f"fleet stopped: {counts}")


def gateway(
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", metavar="FILE", help=INVENTORY_HELP),
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", metavar="ADDR", help="default: TOKENFLEET_HTTP_HOST")
    ] = None,
    port: Annotated[
        int, typer.Option("--port", metavar="N", help="0: any free port (logged)", callback=whole(0, 65535))
    ] = 8000,
    decision_timeout: Annotated[
        float,
        typer.Option(
            "--decision-timeout",
            metavar="S",
            help="answer 503 when the scheduler has not decided within S seconds",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = 30.0,
    reuse_port: Annotated[
        bool,
        typer.Option(
            "--reuse-port",
            help="share --port with other gateway processes started with it (SO_REUSEPORT): "
            "the kernel spreads connections over them, and one that dies takes only its own calls",
        ),
    ] = False,
    probe_port: Annotated[
        int | None,
        typer.Option(
            "--probe-port",
            metavar="N",
            help="also serve /health, /ready and /metrics on port N of this process alone "
            "(with --reuse-port: a probe that reaches this process)",
            callback=whole(1, 65535),
        ),
    ] = None,
) -> None:
    """OpenAI-compatible HTTP front door (/v1/chat/completions, /v1/completions, /v1/models).

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet gateway --inventory inventory.yaml --port 8000
    """
    from gateway.auth import Authenticator
    from gateway.server import Gateway, GatewayOptions, serve
    from infra.kafka.bus import kafka_connection
    from infra.prompts import Prompts

    if port == 0 and reuse_port:
        raise typer.BadParameter("processes sharing a port need its number, not 0", param_hint="--reuse-port")
    settings = load_settings()
    classes = frozenset(settings.slo_classes)  # callers' keys: TOKENFLEET_API_KEYS (gateway/auth.py)
    auth = Authenticator.from_settings(settings.api_keys, settings.trust_tenant_header, classes)
    found = _inventory(inventory, settings)  # a bad inventory is named before the broker is looked for
    require_broker(settings, embedded=None)
    prompts = Prompts.from_dirs({**found.tokenizer_dirs(), **settings.tokenizers})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = GatewayOptions(
        decision_timeout_s=decision_timeout,
        slo_classes=classes,
        app_id=settings.app_id,
        header_timeout_s=settings.gateway_header_timeout_s,
        idle_timeout_s=settings.gateway_idle_timeout_s,
        max_connections=settings.gateway_max_connections,
    )
    with kafka_connection(settings) as connection:
        gw = Gateway(connection, found, prompts, options, auth)
        _run_until_interrupted(
            serve(gw, host or settings.http_host, port, asyncio.Event(), reuse_port, probe_port)
        )


def planner(
    name: Annotated[
        str | None,
        typer.Option(
            "--planner",
            metavar="NAME",
            help="static, hpa, dynamo-sla or fleetmind (default: TOKENFLEET_PLANNER, fleetmind)",
        ),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option("--fleet", metavar="FILE", help="the fleet file (default: TOKENFLEET_FLEET_RULES)"),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            metavar="S",
            help="seconds between plans (default: TOKENFLEET_PLANNER_INTERVAL_S, else the planner's own)",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", metavar="NAME=VALUE", help="a planner parameter (repeatable)"),
    ] = None,
) -> None:
    """The planner: replicas per model version and data centre, on tf.plans and a gauge.

    One planner per fleet is active (a Kafka consumer group chooses); start a second one and it
    waits, and takes over if the first dies.

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet planner --planner fleetmind --fleet fleet.yaml
    """
    from agents.policy import planners
    from infra.kafka.bus import kafka_connection
    from planner.main import load_facts, make_planner, plan_interval, serve

    settings = load_settings()
    planners.check_planner(name or settings.planner)  # an unknown name before the file is read
    facts = load_facts(fleet or settings.fleet_rules)  # a bad file is one line here, not a restart loop
    pairs = [p.partition("=") for p in param or []]
    if any(not key or not eq for key, eq, _ in pairs):
        raise typer.BadParameter("give NAME=VALUE", param_hint="'--param'")
    chosen = make_planner(name or settings.planner, facts, settings, {k: v for k, _, v in pairs})
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka broker configured: set TOKENFLEET_KAFKA_BOOTSTRAP=host:port (the fleet's)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    with kafka_connection(settings) as connection:  # an unreachable broker is waited for, quietly
        counts = _run_until_interrupted(
            serve(settings, connection, chosen, facts, interval_s=plan_interval(settings, chosen, interval))
        )
    print(f"planner stopped: {counts}")


def _inventory(path: str | None, settings: Any) -> Any:
    """The inventory of ``--inventory`` or ``TOKENFLEET_INVENTORY`` (``InventoryError`` if none)."""
    from infra.vllm.inventory import InventoryError, load_inventory

    chosen = path or settings.inventory
    if chosen is None:
        raise InventoryError("no engine inventory: pass --inventory FILE or set TOKENFLEET_INVENTORY")
    return load_inventory(chosen)


def _run_until_interrupted(coro: Any) -> Any:
    """Run ``coro``; Ctrl-C / SIGTERM cancel it cleanly."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        return None
