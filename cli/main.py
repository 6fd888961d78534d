"""``tokenfleet`` command line: the composition root that wires workloads, fleets and policies.

Errors in what the user passed (unknown flag or policy, bad fleet, unreadable trace or policy
config, a number out of range, NaN or infinite) print one line naming the problem and exit
with status 2. Commands import what they need when they run, so start-up (and ``--help``)
stays fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

try:  # recent typer carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from sim.workloads import MOONCAKE

if TYPE_CHECKING:
    from sim.loop.runner import SimConfig

DEMO_TRACE = str(MOONCAKE)
DEFAULT_FLEET = "8xllama3-8b-h100"

app = typer.Typer(
    name="tokenfleet",
    help="TokenFleet LLM fleet scheduler",
    add_completion=False,
    rich_markup_mode=None,  # plain click help and errors: main() prints errors as one line
    pretty_exceptions_enable=False,
)
batch_app = typer.Typer(help="offline batch jobs", rich_markup_mode=None)
schemas_app = typer.Typer(help="event contracts", rich_markup_mode=None)
db_app = typer.Typer(help="the ClickHouse store", rich_markup_mode=None)
slomax_app = typer.Typer(help="SLOMax admission control", rich_markup_mode=None)
app.add_typer(batch_app, name="batch")
app.add_typer(schemas_app, name="schemas")
app.add_typer(db_app, name="db")
app.add_typer(slomax_app, name="slomax")

POLICY_HELP = (
    "a router (round-robin, least-tokens, dynamo-kv, tokenpilot, ...) or stages joined with '+' "
    "(an unknown name lists them all)"
)
WORKLOAD_HELP = "trace file (Mooncake JSONL, Azure CSV) or 'synthetic[:k=v,...]'"
INVENTORY_HELP = "the engines' inventory YAML (default: TOKENFLEET_INVENTORY)"
FLEET_HELP = "COUNTxPROFILE[+...] or a fleet YAML file"
EMBEDDED_HELP = (
    "no TOKENFLEET_KAFKA_BOOTSTRAP: publish into a throwaway embedded broker (what is published "
    "is lost when the command exits)"
)
MAX_SECONDS = 1e7  # the longest duration an option takes: about 115 days
MAX_TOKENS = 10_000_000


def _real(
    low: float, high: float, *, low_open: bool = True, unit: str = ""
) -> Callable[[float | None], float | None]:
    """An option callback: the value must be finite and in (low, high] (``low_open``) or
    [low, high]. Typer's own float ranges let NaN through, so every float option uses this."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]{unit}"

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise typer.BadParameter(f"{value:g} is not a finite number in {interval}")
        return value

    return check


def _whole(low: int, high: int | None = None) -> Callable[[int | None], int | None]:
    """An option callback: the integer must be in [low, high] (no upper bound if None)."""
    interval = f">= {low}" if high is None else f"in [{low}, {high}]"

    def check(value: int | None) -> int | None:
        if value is not None and not (value >= low and (high is None or value <= high)):
            raise typer.BadParameter(f"{value} is not an integer {interval}")
        return value

    return check


RATE_SCALE_HELP = "X times the trace's arrival rate, X in [0.001, 1000]"
_rate_scale = _real(0.001, 1000.0, low_open=False)
_seed = _whole(0, 2**63 - 1)


class LogLevel(StrEnum):
    crit = "crit"
    error = "error"
    warn = "warn"
    info = "info"
    debug = "debug"


# Options shared by the simulator's commands (``simulate``, ``capacity``, ``tail``; ``--rate-scale``
# also ``loadgen`` and ``demo``).
WorkloadOpt = Annotated[str, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)]
FleetOpt = Annotated[str, typer.Option("--fleet", metavar="SPEC", help=FLEET_HELP)]
RateScaleOpt = Annotated[
    float, typer.Option("--rate-scale", metavar="X", help=RATE_SCALE_HELP, callback=_rate_scale)
]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", callback=_seed)]
HeartbeatOpt = Annotated[
    float,
    typer.Option(
        "--heartbeat",
        metavar="S",
        help="heartbeat (metrics refresh) interval in seconds, in [0.001, 3600]",
        callback=_real(0.001, 3600.0, low_open=False, unit=" s"),
    ),
]
SignalDelayOpt = Annotated[
    float,
    typer.Option(
        "--signal-delay",
        metavar="S",
        help="delay before heartbeats and KV events reach the router, seconds in [0, 60]",
        callback=_real(0.0, 60.0, low_open=False, unit=" s"),
    ),
]
JitterOpt = Annotated[
    float,
    typer.Option(
        "--jitter-arrivals",
        metavar="S",
        help="spread each arrival uniformly inside a bin of S seconds (Mooncake: 3), in [0, 3600]",
        callback=_real(0.0, 3600.0, low_open=False, unit=" s"),
    ),
]
RetryShareOpt = Annotated[
    float,
    typer.Option(
        "--retry-share",
        metavar="P",
        help="share of given-up interactive requests retried, in [0, 1]",
        callback=_real(0.0, 1.0, low_open=False),
    ),
]
OutputBudgetOpt = Annotated[
    int | None,
    typer.Option(
        "--output-budget",
        metavar="N",
        help=f"fixed max_tokens for every request, in [1, {MAX_TOKENS}]",
        callback=_whole(1, MAX_TOKENS),
    ),
]
PolicyConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy-config",
        metavar="FILE",
        help="YAML mapping stage name -> parameters, e.g. 'tokenpilot: {tie_tolerance: 0.05}'",
    ),
]
JsonOpt = Annotated[str | None, typer.Option("--json", metavar="OUT", help="write the results as JSON")]


def _sim_config(
    seed: int, heartbeat: float, signal_delay: float, retry_share: float, output_budget: int | None
) -> SimConfig:
    """The simulator's configuration from the options its commands share."""
    from sim.loop.runner import SimConfig

    return SimConfig(
        seed=seed,
        heartbeat_s=heartbeat,
        signal_delay_s=signal_delay,
        retry_share=retry_share,
        output_budget=output_budget,
    )


def _no_bounds(policies: Sequence[str]) -> None:
    """``ideal`` and ``ideal-fleet-cache`` are latency floors ``simulate`` reports, not policies."""
    from sim.evaluation.compare import BOUNDS

    bounds = [name for name in policies if name in BOUNDS]
    if bounds:
        names = ", ".join(bounds)
        raise typer.BadParameter(f"{names} is a latency bound, not a policy", param_hint="--policy")


def _checked_policies(policies: Sequence[str], seed: int, policy_config: Path | None) -> Any:
    """The stage parameters, once every policy name and parameter was checked (before any trace
    is read or policy run)."""
    from agents.policy import PolicyError, build_scheduler
    from agents.policy.registry import params_for
    from sim.evaluation.compare import BOUNDS, check_policies

    params = _load_policy_config(policy_config) if policy_config is not None else None
    try:
        check_policies(policies, params)
    except PolicyError as exc:
        raise PolicyError(f"{exc}; bounds: {', '.join(BOUNDS)}") from None
    for name in policies:
        if name not in BOUNDS:
            build_scheduler(name, seed=seed, params=params_for(name, params))
    return params


ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        metavar="NAME",
        help="a multi-DC scenario (hotspot, version-mismatch, pinned-tenant, dc-failure, or a scenario "
        "YAML): its fleet and workload replace --fleet and --workload",
    ),
]


@app.command()
def simulate(
    workload: Annotated[str | None, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"{POLICY_HELP}; repeat to compare several (a scenario's default: fleetmind+tokenpilot, "
            "local-only, global-least-load)",
        ),
    ] = None,
    scenario: ScenarioOpt = None,
    fleet: FleetOpt = DEFAULT_FLEET,
    rate_scale: RateScaleOpt = 1.0,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
) -> None:
    """Compare routing policies on a trace, or on a multi-DC scenario, in simulation."""
    from rich.console import Console

    from sim.engine.fleet import parse_fleet
    from sim.evaluation.compare import compare
    from sim.evaluation.report import TABLE_WIDTH, comparison, progress_bar
    from sim.workloads.sources import open_workload

    config = _sim_config(seed, heartbeat, signal_delay, retry_share, output_budget)
    if scenario is not None:
        _simulate_scenario(scenario, workload, policy, config, rate_scale, policy_config, json_out)
        return
    if workload is None:
        raise typer.BadParameter("give --workload (or --scenario)", param_hint="'--workload'")
    if not policy:
        raise typer.BadParameter("give at least one --policy", param_hint="'--policy'")
    params = _checked_policies(policy, seed, policy_config)
    spec = parse_fleet(fleet)
    trace = open_workload(workload, seed=seed).jittered(jitter_arrivals, seed)
    if quiet:
        document, timings = compare(trace, spec, policy, config, rate_scale, None, params)
    else:
        with progress_bar() as progress:
            document, timings = compare(trace, spec, policy, config, rate_scale, progress, params)
    Console(width=TABLE_WIDTH, highlight=False).print(comparison(document))
    for timing in timings:
        rate = timing.requests / timing.wall_s if timing.wall_s > 0 else float("inf")
        print(
            f"  {timing.policy}: {timing.wall_s:.2f} s wall, {rate:,.0f} simulated requests/s",
            file=sys.stderr,
        )
    if json_out:
        Path(json_out).write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
        print(f"wrote {json_out}", file=sys.stderr)


def _simulate_scenario(
    name: str,
    workload: str | None,
    policies: list[str] | None,
    config: Any,
    rate_scale: float,
    policy_config: Path | None,
    json_out: str | None,
) -> None:
    from sim.evaluation.scenario import DEFAULT_POLICIES, format_scenario, run_scenario
    from sim.scenarios import load_scenario

    if workload is not None:
        raise typer.BadParameter(
            "a scenario brings its own workload: drop --workload", param_hint="--scenario"
        )
    chosen = list(policies or DEFAULT_POLICIES)
    params = _checked_policies(chosen, config.seed, policy_config)
    loaded = load_scenario(name, seed=config.seed)
    document = run_scenario(loaded, chosen, config, rate_scale, params)
    print(format_scenario(document))
    if json_out:
        Path(json_out).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {json_out}", file=sys.stderr)


@app.command()
def capacity(
    workload: Annotated[str | None, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)] = None,
    scenario: ScenarioOpt = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"{POLICY_HELP}; repeat: the first is judged, the rest compared at the best one's capacity",
        ),
    ] = None,
    fleet: FleetOpt = DEFAULT_FLEET,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    start: Annotated[
        float, typer.Option("--start", metavar="X", help="first rate scale probed", callback=_rate_scale)
    ] = 1.0,
    precision: Annotated[
        float,
        typer.Option(
            "--precision",
            metavar="P",
            help="stop when the bracket is within 1+P, P in [0.001, 1]",
            callback=_real(0.001, 1.0, low_open=False),
        ),
    ] = 0.02,
    jobs: Annotated[
        int, typer.Option("--jobs", metavar="N", help="policies searched in parallel", callback=_whole(1, 64))
    ] = 1,
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
) -> None:
    """SLO capacity: per policy, the highest rate scale keeping 99 % of interactive requests
    within their TTFT and TPOT objective (bisection to --precision)."""
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.capacity import capacities, format_capacity
    from sim.workloads.sources import open_workload

    if scenario is None and workload is None:
        raise typer.BadParameter("give --workload (or --scenario)", param_hint="'--workload'")
    if scenario is None and not policy:
        raise typer.BadParameter("give at least one --policy", param_hint="'--policy'")
    if scenario is not None and workload is not None:
        raise typer.BadParameter(
            "a scenario brings its own workload: drop --workload", param_hint="--scenario"
        )
    if not policy:
        from sim.evaluation.scenario import DEFAULT_POLICIES

        policy = list(DEFAULT_POLICIES)
    _no_bounds(policy)
    params = _checked_policies(policy, seed, policy_config)
    if scenario is not None:
        from sim.scenarios import load_scenario

        loaded = load_scenario(scenario, seed=seed)
        spec, base = loaded.fleet, loaded.workload
    else:
        assert workload is not None
        spec, base = parse_fleet(fleet), open_workload(workload, seed=seed)
    trace = base.jittered(jitter_arrivals, seed)
    config = _sim_config(seed, heartbeat, signal_delay, retry_share, output_budget)
    document = capacities(trace, spec, policy, config, start, precision, params, jobs)
    print(format_capacity(document))
    if json_out:
        Path(json_out).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {json_out}", file=sys.stderr)


@app.command()
def tail(
    workload: WorkloadOpt,
    policy: Annotated[
        list[str], typer.Option("--policy", metavar="NAME", help=f"{POLICY_HELP}; repeat to analyse several")
    ],
    fleet: FleetOpt = DEFAULT_FLEET,
    rate_scale: RateScaleOpt = 1.0,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
) -> None:
    """Where a policy's TTFT tail comes from, against the ideal floor: the prompt cache lost to
    the fleet's capacity (held by no instance) or to routing (held by another), and its cost."""
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.tail import analyse, format_tail, to_json
    from sim.workloads.sources import open_workload

    _no_bounds(policy)
    params = _checked_policies(policy, seed, policy_config)
    spec = parse_fleet(fleet)
    trace = open_workload(workload, seed=seed).jittered(jitter_arrivals, seed).scaled(rate_scale)
    config = _sim_config(seed, heartbeat, signal_delay, retry_share, output_budget)
    tails = [analyse(trace, spec, name, config, params) for name in policy]
    print("\n".join(format_tail(t) for t in tails))
    if json_out:
        document = {"workload": trace.name, "rate_scale": rate_scale, "tails": [to_json(t) for t in tails]}
        Path(json_out).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {json_out}", file=sys.stderr)


@app.command("report")
def report_command(
    result: Annotated[
        Path, typer.Argument(metavar="RESULT.json", help="a simulate, capacity or scoreboard JSON")
    ],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="where the PNG files go")] = Path(
        "out/report"
    ),
) -> None:
    """Draw a result as PNG: TTFT CDFs and goodput per class (simulate), compliance against rate
    scale (capacity)."""
    from sim.evaluation.plots import NotAResult, draw

    try:
        document = json.loads(result.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read {result}: {exc}", param_hint="RESULT.json") from None
    try:
        written = draw(document, out) if isinstance(document, dict) else []
    except (NotAResult, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"{result}: {exc}", param_hint="RESULT.json") from None
    if not written:
        raise typer.BadParameter(f"{result}: not a result document", param_hint="RESULT.json")
    for path in written:
        print(f"wrote {path}")


def _load_policy_config(path: Path) -> dict[str, dict[str, Any]]:
    """Stage parameters from a YAML file (stage name -> keyword parameters); ValueError with
    one line saying what is wrong if the file is missing, not YAML or not that shape."""
    from infra.yaml_files import read_yaml

    data = read_yaml(path, "policy config")
    shape = "must map stage names to parameter mappings, e.g. 'tokenpilot: {tie_tolerance: 0.05}'"
    if not isinstance(data, dict):
        raise ValueError(f"policy config {str(path)!r} {shape}")
    for stage, kwargs in data.items():
        if (
            not isinstance(stage, str)
            or not isinstance(kwargs, dict)
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise ValueError(f"policy config {str(path)!r}: stage {stage!r} {shape}")
    return data


@app.command()
def generate(
    out: Annotated[str, typer.Option("--out", metavar="FILE")],
    duration: Annotated[
        float,
        typer.Option("--duration", metavar="S", help="seconds of traffic", callback=_real(0.0, MAX_SECONDS)),
    ] = 600.0,
    rate: Annotated[
        float,
        typer.Option("--rate", metavar="R", help="mean requests per second", callback=_real(0.0, 1e5)),
    ] = 4.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", callback=_seed)] = 0,
) -> None:
    """Write a synthetic multi-tenant workload (Mooncake JSONL)."""
    from sim.workloads.synthetic import SyntheticMix, write_jsonl

    mix = SyntheticMix(duration_s=duration, rate_per_s=rate, seed=seed)
    count = write_jsonl(mix.generate(), Path(out))
    print(f"wrote {count} requests to {out}")


def _settings(policy: str | None = None) -> Any:
    from infra.settings import Settings

    if policy is None:
        return Settings()
    from agents.policy.registry import parse_policy

    parse_policy(policy)  # an unknown name is a one-line error here, not deep in the worker
    return Settings(policy=policy)


@app.command()
def worker(
    policy: Annotated[
        str | None, typer.Option("--policy", metavar="NAME", help=f"routing policy: {POLICY_HELP}")
    ] = None,
    loglevel: Annotated[LogLevel, typer.Option("--loglevel")] = LogLevel.warn,
) -> None:
    """Run the streaming scheduler (Faust worker)."""
    from infra.bootstrap import policy_params
    from worker.supervisor import run_worker

    settings = _settings(policy)
    policy_params(settings)  # a bad fleet rules file is a one-line error here, not a restart loop
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run_worker(settings, loglevel=loglevel.value)


@app.command("fleet")
def fleet_command(
    fleet: Annotated[str, typer.Option("--fleet", metavar="SPEC", help=FLEET_HELP)] = (DEFAULT_FLEET),
    speed: Annotated[
        float,
        typer.Option(
            "--speed",
            metavar="X",
            help="emulated time runs X times faster, X in [0.001, 1e6]",
            callback=_real(0.001, 1e6, low_open=False),
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
    """The dispatcher: execute routing decisions on emulated instances or real vLLM servers."""
    from dispatcher.service import run_fleet
    from infra.bootstrap import kafka_bootstrap

    settings = _settings()
    engines: Any = fleet
    lengths = None
    if workload is not None:
        from lab.loadgen import workload_output_tokens
        from sim.workloads.sources import open_workload

        lengths = workload_output_tokens(open_workload(workload, seed=seed))
    if engine == "vllm":
        from dispatcher.engines.vllm.adapter import VllmEngines

        engines = VllmEngines(_inventory(inventory, settings), scrape_s=settings.scrape_interval_s)
    elif engine == "emulated":
        from sim.engine.fleet import parse_fleet

        parse_fleet(fleet)  # fail fast on a bad spec
    else:
        raise ValueError(f"--engine must be emulated or vllm, not {engine!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with kafka_bootstrap(settings) as bootstrap:
        counts = _run_until_interrupted(
            run_fleet(
                bootstrap,
                engines,
                speed=speed,
                heartbeat_s=settings.heartbeat_interval_s,
                output_tokens=lengths,
            )
        )
    print(f"fleet stopped: {counts}")


@app.command()
def gateway(
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", metavar="FILE", help=INVENTORY_HELP),
    ] = None,
    host: Annotated[str, typer.Option("--host", metavar="ADDR")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="N", callback=_whole(1, 65535))] = 8000,
    decision_timeout: Annotated[
        float,
        typer.Option(
            "--decision-timeout",
            metavar="S",
            help="answer 503 when the scheduler has not decided within S seconds",
            callback=_real(0.0, MAX_SECONDS),
        ),
    ] = 30.0,
) -> None:
    """OpenAI-compatible HTTP front door (/v1/chat/completions, /v1/completions, /v1/models)."""
    from gateway.server import Gateway, GatewayOptions, serve
    from infra.bootstrap import kafka_bootstrap
    from infra.prompts import Prompts

    settings = _settings()
    _require_broker(settings, embedded=None)
    found = _inventory(inventory, settings)
    prompts = Prompts.from_dirs({**found.tokenizer_dirs(), **settings.tokenizers})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with kafka_bootstrap(settings) as bootstrap:
        gw = Gateway(bootstrap, found, prompts, GatewayOptions(decision_timeout_s=decision_timeout))
        _run_until_interrupted(serve(gw, host, port, asyncio.Event()))


def _inventory(path: str | None, settings: Any) -> Any:
    """The inventory of ``--inventory`` or ``TOKENFLEET_INVENTORY`` (``InventoryError`` if none)."""
    from infra.vllm.inventory import InventoryError, load_inventory

    chosen = path or settings.inventory
    if chosen is None:
        raise InventoryError("no engine inventory: pass --inventory FILE or set TOKENFLEET_INVENTORY")
    return load_inventory(chosen)


@app.command()
def loadgen(
    workload: Annotated[str, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)],
    rate_scale: RateScaleOpt = 1.0,
    model: Annotated[
        str, typer.Option("--model", metavar="NAME", help="model pool the requests are for")
    ] = "llama3-8b",
    limit: Annotated[
        int | None,
        typer.Option("--limit", metavar="N", help="stop after N requests", callback=_whole(1)),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            metavar="S",
            help="stop after S seconds of (scaled) arrivals",
            callback=_real(0.0, MAX_SECONDS),
        ),
    ] = None,
    fast: Annotated[
        bool, typer.Option("--fast", help="publish as fast as possible, not in real time")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", callback=_seed)] = 0,
    embedded: Annotated[bool, typer.Option("--embedded", help=EMBEDDED_HELP)] = False,
) -> None:
    """Publish a workload to tf.requests (of the broker TOKENFLEET_KAFKA_BOOTSTRAP names)."""
    from infra.bootstrap import kafka_bootstrap
    from lab.loadgen import publish_workload
    from sim.workloads.sources import open_workload

    settings = _settings()
    _require_broker(settings, embedded)
    trace = open_workload(workload, seed=seed)
    with kafka_bootstrap(settings) as bootstrap:
        sent = asyncio.run(
            publish_workload(
                bootstrap,
                trace,
                rate_scale=rate_scale,
                model=model,
                limit=limit,
                duration_s=duration,
                realtime=not fast,
            )
        )
    print(f"published {sent} requests to tf.requests")


@batch_app.command("submit")
def batch_submit(
    file: Annotated[str, typer.Argument(metavar="FILE")],
    deadline: Annotated[str, typer.Option("--deadline", metavar="DURATION", help="e.g. 30m, 2h, 900s")],
    model: Annotated[str, typer.Option("--model", metavar="NAME")] = "llama3-8b",
    embedded: Annotated[bool, typer.Option("--embedded", help=EMBEDDED_HELP)] = False,
) -> None:
    """Publish a JSONL file of requests as one batch job (to TOKENFLEET_KAFKA_BOOTSTRAP's broker)."""
    from infra.bootstrap import kafka_bootstrap
    from lab.loadgen import parse_duration, submit_batch

    deadline_s = parse_duration(deadline)
    settings = _settings()
    _require_broker(settings, embedded)
    with kafka_bootstrap(settings) as bootstrap:
        job = asyncio.run(submit_batch(bootstrap, Path(file), deadline_s, model=model))
    print(f"submitted batch job {job.job_id}: {len(job.requests)} requests, deadline in {deadline_s:.0f} s")


@batch_app.command("results")
def batch_results(
    job: Annotated[str, typer.Argument(metavar="JOB")],
    out: Annotated[str, typer.Option("--out", metavar="FILE", help="where to write the answers (JSONL)")],
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="S",
            help="wait up to S seconds for every answer",
            callback=_real(0.0, MAX_SECONDS),
        ),
    ] = 60.0,
) -> None:
    """Collect a batch job's answers from tf.responses into a JSONL file."""
    from infra.bootstrap import kafka_bootstrap
    from infra.kafka.batches import collect_results

    settings = _settings()
    _require_broker(settings, embedded=None)
    with kafka_bootstrap(settings) as bootstrap:
        written, expected = asyncio.run(collect_results(bootstrap, job, Path(out), timeout))
    print(f"{written} of {expected} answers of {job} written to {out}")
    if written < expected:
        raise typer.Exit(1)


def _require_broker(settings: Any, embedded: bool | None) -> None:
    """A command that only publishes needs a broker that outlives it: refuse to publish into a
    throwaway embedded one unless ``--embedded`` asks for exactly that (and say so). ``None``:
    the command has no ``--embedded`` (it needs the worker's broker, whatever it does)."""
    if settings.kafka_bootstrap:
        return
    if not embedded:
        offer = "" if embedded is None else ", or pass --embedded to publish into a throwaway embedded broker"
        raise ValueError(
            "no Kafka broker configured: set TOKENFLEET_KAFKA_BOOTSTRAP=host:port (the broker the "
            f"worker reads){offer}"
        )
    print(
        "warning: --embedded: publishing into an embedded broker that stops with this command; "
        "what it publishes is lost when the command exits",
        file=sys.stderr,
    )


@schemas_app.command("export")
def schemas_export(directory: Annotated[str, typer.Argument(metavar="DIR")]) -> None:
    """Write JSON Schema files for every event."""
    from schemas.export import export_json_schemas

    for path in export_json_schemas(Path(directory)):
        print(path)


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending migrations, and re-apply those whose tables or columns are missing."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.migrate import migrate

    settings = _settings()
    client = _open_store(settings.clickhouse_url)
    try:
        applied = migrate(client)
    except ClickHouseError as exc:
        raise ValueError(f"migration failed: {_first_line(exc)}") from None
    finally:
        client.close()
    print("\n".join(applied) if applied else "database is up to date")


@slomax_app.command("status")
def slomax_status(
    steps: Annotated[
        int, typer.Option("--steps", metavar="N", help="control steps to show", callback=_whole(1, 1000))
    ] = 5,
) -> None:
    """SLOMax's shares and thresholds in force (the configured policy's), its last control steps
    and the rejects of the last 5 minutes by reason, read from the store."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.migrate import migrate
    from infra.slomax_status import status_lines

    settings = _settings()
    client = _open_store(settings.clickhouse_url)
    try:
        migrate(client)  # a fresh store has the tables (and nothing in them) rather than an error
        print("\n".join(status_lines(client, settings, steps)))
    except ClickHouseError as exc:
        raise ValueError(f"cannot read the store: {_first_line(exc)}") from None
    finally:
        client.close()


@app.command()
def sql(
    query: Annotated[str, typer.Argument(metavar="QUERY")],
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="allow statements that change the store (INSERT, ALTER, DROP, ...) and functions "
            "that read files or URLs",
        ),
    ] = False,
    max_rows: Annotated[
        int,
        typer.Option(
            "--max-rows", metavar="N", help="refuse results of more rows", callback=_whole(1, MAX_TOKENS)
        ),
    ] = 10_000,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="S",
            help="stop the query after S seconds",
            callback=_real(0.0, 3600.0, unit=" s"),
        ),
    ] = 30.0,
) -> None:
    """Run a ClickHouse SQL query on the store (tab-separated output); read-only unless --write:
    one SELECT, WITH, SHOW, DESCRIBE, EXPLAIN or EXISTS statement, run with readonly=1."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import check_read_only, query_settings

    if not write:
        check_read_only(query)  # before the store is opened
    settings = _settings()
    client = _open_store(settings.clickhouse_url)
    try:
        try:
            result = client.query(query, settings=query_settings(max_rows, timeout, write))
        except ClickHouseError as exc:
            message = _first_line(exc)
            if not write and "READONLY" in message:
                message += " (the query is read-only; pass --write to change the store)"
            raise ValueError(message) from None
        print("\t".join(result.column_names))
        for row in result.result_rows:
            print("\t".join("" if v is None else str(v) for v in row))
    finally:
        client.close()


def _open_store(url: str) -> Any:
    """A client on the store at ``url``; a store that cannot be opened is one line (exit 2)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import connect

    try:
        return connect(url)
    except ClickHouseError as exc:
        raise ValueError(f"cannot open the store: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@app.command()
def demo(
    duration: Annotated[
        float,
        typer.Option("--duration", metavar="S", help="seconds of load", callback=_real(0.0, MAX_SECONDS)),
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
            "--concurrency", metavar="N", help="--engine vllm: users at once", callback=_whole(1, 256)
        ),
    ] = 8,
) -> None:
    """Broker + ClickHouse + worker + fleet (emulated or real vLLM) + load, end to end."""
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
        code = run_vllm_demo(_settings(), vllm_options)
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
    code = run_demo(_settings(), options)
    if code:
        raise typer.Exit(code)


def _run_until_interrupted(coro: Any) -> Any:
    """Run ``coro``; Ctrl-C / SIGTERM cancel it cleanly."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        return None


def _error(prog: str, message: str) -> None:
    """One line on stderr, however many lines ``message`` has."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the process arguments) and return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        # standalone_mode=False: click raises its errors instead of printing usage and a box.
        result = command.main(args, prog_name="tokenfleet", standalone_mode=False)
    except ClickException as exc:
        ctx = exc.ctx if isinstance(exc, UsageError) else None
        _error(ctx.command_path if ctx is not None else "tokenfleet", exc.format_message())
        return exc.exit_code
    except (ValueError, KeyError, OSError) as exc:
        # The top-level group takes no options, so args[0] is the command that failed (and
        # args[1] the subcommand of a group: batch submit, db migrate).
        group = args[0] in {"batch", "schemas", "db"} and len(args) > 1
        _error(f"tokenfleet {' '.join(args[:2] if group else args[:1])}", str(exc))
        return 2
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
