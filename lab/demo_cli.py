"""``python -m lab.demo_cli``: the demo's command line (``make demo``, ``make demo-vllm``).

The demo runs the lab (``lab.demo``: broker, store, worker, fleet and load in one process;
``lab.demo_vllm``: the same through two real vLLM servers and the gateway), so it is no
``tokenfleet`` command: the wheel holds the product only. Options::

    python -m lab.demo_cli [--duration S] [--policy NAME ...] [--workload PATH] [--rate-scale X]
                           [--fleet SPEC] [--json OUT] [--engine emulated|vllm] [--concurrency N]

Repeat ``--policy`` to run the demo once per policy on the same load and compare (default:
``round-robin``; with ``--engine vllm``: ``round-robin`` then ``tokenpilot``). Bad input is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from sim.workloads import MOONCAKE

PROG = "python -m lab.demo_cli"
DEMO_TRACE = str(MOONCAKE)
DEMO_FLEET = "8xllama3-8b-h100"
MAX_SECONDS = 1e7  # about 115 days, as the command line's longest duration


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(2)


def _number(low: float, high: float, *, low_open: bool) -> Callable[[str], float]:
    """A finite number in (low, high] (``low_open``) or [low, high]."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number in {interval}")
        return value

    return parse


def _users(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [1, 256]")
    return int(text)


def parser() -> argparse.ArgumentParser:
    cli = _Parser(prog=PROG, description="Broker + ClickHouse + worker + fleet + load, end to end.")
    cli.add_argument(
        "--duration", type=_number(0.0, MAX_SECONDS, low_open=True), default=60.0, metavar="S",
        help="seconds of load (default 60)",
    )  # fmt: skip
    cli.add_argument(
        "--policy", action="append", metavar="NAME",
        help="routing policy (default round-robin); repeat to run the demo once per policy and compare",
    )  # fmt: skip
    cli.add_argument(
        "--workload", default=DEMO_TRACE, metavar="PATH",
        help="trace file (Mooncake JSONL, Azure CSV) or 'synthetic[:k=v,...]' (default: the Mooncake trace)",
    )  # fmt: skip
    cli.add_argument(
        "--rate-scale", type=_number(0.001, 1000.0, low_open=False), default=1.0, metavar="X",
        help="X times the trace's arrival rate, X in [0.001, 1000]",
    )  # fmt: skip
    cli.add_argument(
        "--fleet", default=DEMO_FLEET, metavar="SPEC",
        help=f"COUNTxPROFILE[+...] or a fleet YAML file (default {DEMO_FLEET})",
    )  # fmt: skip
    cli.add_argument("--json", type=Path, metavar="OUT", help="write the summary as JSON")
    cli.add_argument(
        "--engine", choices=("emulated", "vllm"), default="emulated",
        help="emulated (the emulated fleet, --fleet, load from --workload) or vllm (two real vLLM servers "
        "on a tiny model, the gateway, the openai client as load; `make engine` first)",
    )  # fmt: skip
    cli.add_argument(
        "--concurrency", type=_users, default=8, metavar="N", help="--engine vllm: users at once (default 8)"
    )
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo as asked; its exit status (0: every run decided and completed requests)."""
    args = parser().parse_args(argv)
    from agents.policy.registry import parse_policy
    from infra.settings import read_settings

    try:
        for name in args.policy or []:
            parse_policy(name)
        settings = read_settings()
        if args.engine == "vllm":
            from lab.demo_vllm import VllmDemoOptions, run_vllm_demo

            vllm_options = VllmDemoOptions(
                duration=args.duration,
                concurrency=args.concurrency,
                json_path=args.json,
                policy_names=tuple(args.policy) if args.policy else VllmDemoOptions.policy_names,
            )
            return run_vllm_demo(settings, vllm_options)
        from lab.demo import DemoOptions, run_demo
        from sim.engine.fleet import parse_fleet

        parse_fleet(args.fleet)  # a bad fleet is named before the broker and the worker start
        options = DemoOptions(
            workload=args.workload,
            fleet=args.fleet,
            duration=args.duration,
            policy_names=tuple(args.policy or ()),
            rate_scale=args.rate_scale,
            json_path=args.json,
        )
        return run_demo(settings, options)
    except (ValueError, OSError) as exc:  # an unknown policy, a bad fleet or trace, a settings file
        fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
