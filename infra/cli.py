"""``tokenfleet`` command line: the composition root that wires workloads, fleets and policies.

Errors in what the user passed (unknown policy, bad fleet, unreadable trace) print one line
naming the problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def _simulate(args: argparse.Namespace) -> int:
    from sim.compare import compare
    from sim.fleet import parse_fleet
    from sim.report import format_table, progress_bar
    from sim.runner import SimConfig
    from sim.sources import open_workload

    workload = open_workload(args.workload, seed=args.seed)
    fleet = parse_fleet(args.fleet)
    config = SimConfig(
        seed=args.seed,
        heartbeat_s=args.heartbeat,
        retry_share=args.retry_share,
        output_budget=args.output_budget,
    )
    progress = None if args.quiet else progress_bar()
    document, timings = compare(workload, fleet, args.policy, config, args.rate_scale, progress)
    print(format_table(document))
    for timing in timings:
        rate = timing.requests / timing.wall_s if timing.wall_s > 0 else float("inf")
        print(
            f"  {timing.policy}: {timing.wall_s:.2f} s wall, {rate:,.0f} simulated requests/s",
            file=sys.stderr,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from sim.synthetic import SyntheticMix, write_jsonl

    mix = SyntheticMix(duration_s=args.duration, rate_per_s=args.rate, seed=args.seed)
    count = write_jsonl(mix.generate(), Path(args.out))
    print(f"wrote {count} requests to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sim.compare import known_policies

    parser = argparse.ArgumentParser(prog="tokenfleet", description="TokenFleet LLM fleet scheduler")
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser("simulate", help="compare routing policies on a trace in simulation")
    sim.add_argument(
        "--workload", required=True, help="trace file (Mooncake JSONL, Azure CSV) or 'synthetic[:k=v,...]'"
    )
    sim.add_argument(
        "--policy", action="append", required=True, choices=known_policies(), help="repeat to compare several"
    )
    sim.add_argument("--fleet", default="8xllama3-8b-h100", help="COUNTxPROFILE[+...] or a fleet YAML file")
    sim.add_argument("--rate-scale", type=float, default=1.0, help="X times the trace's arrival rate")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--heartbeat", type=float, default=0.25, help="heartbeat interval in seconds")
    sim.add_argument(
        "--retry-share", type=float, default=0.5, help="share of given-up interactive requests retried"
    )
    sim.add_argument("--output-budget", type=int, default=None, help="fixed max_tokens for every request")
    sim.add_argument("--json", metavar="OUT", help="write the results as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(run=_simulate)

    gen = commands.add_parser("generate", help="write a synthetic multi-tenant workload (Mooncake JSONL)")
    gen.add_argument("--out", required=True)
    gen.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    gen.add_argument("--rate", type=float, default=4.0, help="mean requests per second")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(run=_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except (ValueError, KeyError) as exc:
        print(f"tokenfleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
