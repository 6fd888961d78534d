"""``tokenfleet demo``: broker, store, worker, fleet and load in one process, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.options import (
    DEFAULT_FLEET,
    FLEET_HELP,
    MAX_SECONDS,
    POLICY_HELP,
    WORKLOAD_HELP,
    RateScaleOpt,
    load_settings,
    real,
    whole,
)
from sim.workloads import MOONCAKE

DEMO_TRACE = str(MOONCAKE)


def demo(
    duration: Annotated[
        float,
        typer.Option("--duration", metavar="S", help="seconds of load", callback=real(0.0, MAX_SECONDS)),
    ] = 60.0,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"routing policy (default round-robin): {POLICY_HELP}; "
            "repeat to run the demo once per policy and compare",
        ),
    ] = None,
    workload: Annotated[str, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)] = DEMO_TRACE,
    rate_scale: RateScaleOpt = 1.0,
    fleet: Annotated[str, typer.Option("--fleet", metavar="SPEC", help=FLEET_HELP)] = DEFAULT_FLEET,
    json_out: Annotated[
        str | None, typer.Option("--json", metavar="OUT", help="write the summary as JSON")
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            metavar="KIND",
            help="emulated (the emulated fleet, --fleet, load from --workload) or vllm (two real vLLM "
            "servers on a tiny model, the gateway, the openai client as load; `make engine` first)",
        ),
    ] = "emulated",
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", metavar="N", help="--engine vllm: users at once", callback=whole(1, 256)
        ),
    ] = 8,
) -> None:
    """Broker + ClickHouse + worker + fleet (emulated or real vLLM) + load, end to end.

    \b
    Example:
      tokenfleet demo --duration 30 --policy round-robin --policy tokenpilot --json out/demo.json
    """
    from agents.policy.registry import parse_policy
    from lab.demo import DemoOptions, run_demo

    for name in policy or []:
        parse_policy(name)
    if engine == "vllm":
        from lab.demo_vllm import VllmDemoOptions, run_vllm_demo

        vllm_options = VllmDemoOptions(
            duration=duration,
            concurrency=concurrency,
            json_path=Path(json_out) if json_out is not None else None,
            policy_names=tuple(policy) if policy else VllmDemoOptions.policy_names,
        )
        code = run_vllm_demo(load_settings(), vllm_options)
        if code:
            raise typer.Exit(code)
        return
    if engine != "emulated":
        raise ValueError(f"--engine must be emulated or vllm, not {engine!r}")
    options = DemoOptions(
        workload=workload,
        fleet=fleet,
        duration=duration,
        policy_names=tuple(policy or ()),
        rate_scale=rate_scale,
        json_path=Path(json_out) if json_out is not None else None,
    )
    code = run_demo(load_settings(), options)
    if code:
        raise typer.Exit(code)
