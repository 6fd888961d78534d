"""What the commands share: option types, their validators and help texts, the settings, and
the one-line error (the checks of policy and planner names: ``cli/choices.py``).

Validators raise ``typer.BadParameter`` (click reports it as ``Invalid value for '--x'``) or
``ValueError`` (``cli.main.main`` prints it); either way one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sim.engine.fleet import FleetSpec
    from sim.loop.config import SimConfig

DEFAULT_FLEET = "8xllama3-8b-h100"

POLICY_HELP = (
    "a router (round-robin, least-tokens, dynamo-kv, tokenpilot, ...) or stages joined with '+' "
    "(an unknown name lists them all)"
)
OWN_WORKLOAD = "a scenario brings its own workload: drop --workload"
WORKLOAD_HELP = "trace file (Mooncake JSONL, Azure CSV) or 'synthetic[:k=v,...]'"
INVENTORY_HELP = "the engines' inventory YAML (default: TOKENFLEET_INVENTORY)"
FLEET_HELP = "COUNTxPROFILE[+...] or a fleet YAML file"
EMBEDDED_HELP = (
    "no TOKENFLEET_KAFKA_BOOTSTRAP: publish into a throwaway embedded broker (what is published "
    "is lost when the command exits)"
)
MAX_SECONDS = 1e7  # the longest duration an option takes: about 115 days
MAX_TOKENS = 10_000_000  # schemas.events.MAX_TOKENS, not imported: -h starts without pydantic


def real(
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


def whole(low: int, high: int | None = None) -> Callable[[int | None], int | None]:
    """An option callback: the integer must be in [low, high] (no upper bound if None)."""
    interval = f">= {low}" if high is None else f"in [{low}, {high}]"

    def check(value: int | None) -> int | None:
        if value is not None and not (value >= low and (high is None or value <= high)):
            raise typer.BadParameter(f"{value} is not an integer {interval}")
        return value

    return check


RATE_SCALE_HELP = "X times the trace's arrival rate, X in [0.001, 1000]"
check_rate_scale = real(0.001, 1000.0, low_open=False)
check_seed = whole(0, 2**63 - 1)


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
    float, typer.Option("--rate-scale", metavar="X", help=RATE_SCALE_HELP, callback=check_rate_scale)
]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", callback=check_seed)]
HeartbeatOpt = Annotated[
    float,
    typer.Option(
        "--heartbeat",
        metavar="S",
        help="heartbeat (metrics refresh) interval in seconds, in [0.001, 3600]",
        callback=real(0.001, 3600.0, low_open=False, unit=" s"),
    ),
]
SignalDelayOpt = Annotated[
    float,
    typer.Option(
        "--signal-delay",
        metavar="S",
        help="delay before heartbeats and KV events reach the router, s in [0, 60], under 2 heartbeats",
        callback=real(0.0, 60.0, low_open=False, unit=" s"),
    ),
]
JitterOpt = Annotated[
    float,
    typer.Option(
        "--jitter-arrivals",
        metavar="S",
        help="spread each arrival uniformly inside a bin of S seconds (Mooncake: 3), in [0, 3600]",
        callback=real(0.0, 3600.0, low_open=False, unit=" s"),
    ),
]
RetryShareOpt = Annotated[
    float,
    typer.Option(
        "--retry-share",
        metavar="P",
        help="share of given-up interactive requests retried, in [0, 1]",
        callback=real(0.0, 1.0, low_open=False),
    ),
]
OutputBudgetOpt = Annotated[
    int | None,
    typer.Option(
        "--output-budget",
        metavar="N",
        help=f"fixed max_tokens for every request, in [1, {MAX_TOKENS}]",
        callback=whole(1, MAX_TOKENS),
    ),
]
DecidersOpt = Annotated[
    int, typer.Option("--deciders", metavar="N", help="deciders per pool, in [1, 64]", callback=whole(1, 64))
]
DecisionLogDelayOpt = Annotated[
    float,
    typer.Option(
        "--decision-log-delay",
        metavar="S",
        help="how late a decider reads the others' placements, seconds in [0, 60]",
        callback=real(0.0, 60.0, low_open=False, unit=" s"),
    ),
]
SPLIT_HELP = (
    "who decides a request: affinity (a hash of its first 2 048 prompt tokens, else its tenant) or random"
)
DeciderSplitOpt = Annotated[str, typer.Option("--decider-split", metavar="affinity|random", help=SPLIT_HELP)]
PolicyConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy-config",
        metavar="FILE",
        help="YAML mapping stage name -> parameters, e.g. 'tokenpilot: {tie_tolerance: 0.05}'",
    ),
]
KV_CONNECTOR_HELP = (
    "--engines local or emulated: example gives every vLLM server vLLM's ExampleConnector on a shared "
    "directory of the stack (a test connector: it keeps every prompt's KV cache on disk) and the worker a "
    "KV link: calls may be served disaggregated, a --planner may run servers prefill only; none (the "
    "default): every server serves whole, plans' prefill counts are ignored"
)
KvConnectorOpt = Annotated[
    str | None,
    typer.Option(
        "--kv-connector",
        metavar="none|example",
        help=KV_CONNECTOR_HELP,
        callback=lambda name: None if name == "none" else name,  # other names: local.plan refuses them
    ),
]
JsonOpt = Annotated[str | None, typer.Option("--json", metavar="OUT", help="write the results as JSON")]
ProfilesOpt = Annotated[
    Path | None,
    typer.Option(
        "--profiles",
        metavar="FILE",
        help="engine profiles YAML (e.g. from 'tokenfleet replay calibrate'): they join the built-in "
        "profiles for this run, replacing those of the same name, so --fleet can name them",
    ),
]
ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        metavar="NAME",
        help="a multi-DC scenario (hotspot, version-mismatch, pinned-tenant, dc-failure, or a scenario "
        "YAML): its fleet and workload replace --fleet and --workload",
    ),
]


def check_scenario(scenario: str | None, workload: str | None, profiles: Path | None = None) -> None:
    """A scenario brings its own fleet and workload: ``--workload`` or ``--profiles`` beside
    ``--scenario`` is a one-line error."""
    if scenario is not None and workload is not None:
        raise typer.BadParameter(OWN_WORKLOAD, param_hint="--scenario")
    if scenario is not None and profiles is not None:
        raise typer.BadParameter("a scenario brings its own fleet: drop --profiles", param_hint="--scenario")


def fleet_spec(fleet: str, profiles: Path | None = None) -> FleetSpec:
    """``--fleet`` parsed with the profiles of ``--profiles`` beside the built-in ones; a bad
    fleet or profiles file is a ``ValueError`` (one line, exit 2)."""
    from sim.engine.fleet import parse_fleet
    from sim.engine.profiles import BUILT_IN, load_profiles

    return parse_fleet(fleet, BUILT_IN if profiles is None else load_profiles(profiles))


def sim_config(
    seed: int,
    heartbeat: float,
    signal_delay: float,
    retry_share: float,
    output_budget: int | None,
    deciders: int = 1,
    log_delay: float = 0.005,
    split: str = "affinity",
) -> SimConfig:
    """The simulator's configuration from the options its commands share: ``deciders`` per pool
    read each other's placements ``log_delay`` s late, requests split by ``split``."""
    from sim.loop.config import SimConfig

    return SimConfig(
        seed=seed,
        heartbeat_s=heartbeat,
        signal_delay_s=signal_delay,
        retry_share=retry_share,
        output_budget=output_budget,
        deciders=deciders,
        decision_log_delay_s=log_delay,
        decider_split=split,  # type: ignore[arg-type]  # (SimConfig checks it)
    )


def load_settings(policy: str | None = None) -> Any:
    """Every command's settings, with ``policy`` in force if given and known; a bad value or
    settings file is a one-line ``ConfigError`` (a ``ValueError``: exit 2, ``cli.main``)."""
    from infra.settings import read_settings

    if policy is None:
        return read_settings()
    from agents.policy.registry import parse_policy

    parse_policy(policy)  # an unknown name is a one-line error here, not deep in the worker
    return read_settings(policy=policy)


def require_broker(settings: Any, embedded: bool | None) -> None:
    """A command that only publishes needs a broker that outlives it: refuse to publish into a
    throwaway embedded one unless ``--embedded`` asks for exactly that (and say so). ``None``:
    the command has no ``--embedded`` (it needs the worker's broker, whatever it does). A
    configured broker must answer within seconds, and take this client's TLS and SASL
    (``require_reachable``)."""
    if settings.kafka_bootstrap:
        from infra.kafka.broker import require_reachable
        from infra.kafka.connection import KafkaConnection

        require_reachable(KafkaConnection.from_settings(settings))
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


def write_json(path: str | None, document: Any) -> None:
    """``--json OUT``: write ``document`` there (indented) and say so on stderr; nothing if None."""
    if path:
        Path(path).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def error(prog: str, message: str) -> None:
    """One line on stderr, however many lines ``message`` has."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
