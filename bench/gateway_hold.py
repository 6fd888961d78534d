"""Normal calls through the gateway while idle and slowloris clients hold connections to it.

``python -m bench.gateway_hold [--url URL [--pid PID] [--model M]] [--calls 2000]
[--concurrency 6] [--idle 1000] [--slow 10] [--byte-every-s 1] [--rounds 1]
[--header-timeout-s 10] [--idle-timeout-s 75] [--max-connections 10000] [--hold-max-s 60]
[--json J]``

Without ``--url`` it starts ``python -m lab.gateway_alone`` on a free loopback port: the real
gateway (its broker link, its direct lane, its connection bounds as given here) in front of a
decider and an engine that answer at once, so the figures are the gateway's own. With ``--url``
it measures that gateway as it is configured (``--pid``: its process, to count its open files;
``--model``: a model it serves). The run itself is ``lab/gateway_hold.py``'s ``measure`` (the
fault suite's ``gateway_slow_clients`` holds clients with its ``Holders``).

Each phase is ``--calls`` non-streamed chat calls (8 tokens), ``--concurrency`` at a time over
kept-alive connections; 200 calls warm up first. ``--rounds`` times: ``alone`` (nothing else
holds the gateway), then ``held``: ``--idle`` connections opened and left silent, and
``--slow`` slowloris clients (each sends a request's headers one byte every
``--byte-every-s``, for ever; a client that is cut connects again, so as many are held
throughout); the calls start once all are open, then the bench holds on until every slow client
was cut once (``--hold-max-s`` from the start of the hold at most) and lets go. A last
``alone`` phase ends the run. Alone and held phases alternate so that a machine whose load
drifts (other processes) weighs on both alike.

Printed (and in ``--json``): each phase's call time p50 / p99 / mean and errors, and all alone
calls against all held ones; the slow clients' connections, how many were cut, the seconds from
a connection's first byte to its cut (min / median / max) and the gateway's answer (its status
line); the idle connections cut while held; the gateway's cuts by reason from its
``/metrics``; its open files before, while held (the most) and 2 s after the last hold (from
``/proc/PID/fd``).
This process holds ``--idle`` + ``--slow`` + ``--concurrency`` sockets at once: if its soft
open-file limit is lower, it raises it (up to the hard limit) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.server import GatewayOptions
from infra.kafka.broker import free_port
from lab.gateway_hold import HoldOptions, fit_open_files, measure


def _fit_open_files(needed: int) -> dict[str, int]:
    """``lab.gateway_hold.fit_open_files``, said on stderr; exits if the hard limit is short."""
    limit = fit_open_files(needed)
    if limit["soft"] != limit["soft_before"]:
        print(
            f"raised this process's soft open-file limit from {limit['soft_before']} to {limit['soft']}",
            file=sys.stderr,
        )
    if 0 <= limit["soft"] < needed:
        raise SystemExit(f"{needed} open files needed, the hard limit is {limit['hard']}: ulimit -Hn")
    return limit


def _print(report: dict[str, Any]) -> None:
    options = report["options"]
    print(f"gateway {report['url']}; {options['calls']} calls per phase, {options['concurrency']} at a time")
    print(f"{'phase':<16} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'answered':>9}  errors")
    rows = [
        (f"{kind} {i + 1}", r[kind]) for i, r in enumerate(report["rounds"]) for kind in ("alone", "held")
    ]
    rows += [(f"alone {len(report['rounds']) + 1}", report["alone_last"])]
    rows += [("alone, all", report["alone"]), ("held, all", report["held"])]
    for name, p in rows:
        print(
            f"{name:<16} {p['p50_ms']:>8} {p['p99_ms']:>8} {p['mean_ms']:>8} {p['answered']:>9}  "
            f"{p['errors'] or '-'}"
        )
    slow, idle = report["slow"], report["idle"]
    print(
        f"slow clients: {slow['clients']} ({slow['connections']} connections), {slow['cut']} cut, "
        f"cut after (s from the first byte) {slow['cut_after_s']}; answers {slow['answers']}"
    )
    print(f"idle: {idle['held']} held for {idle['hold_s']} s, {idle['cut_while_held']} cut while held")
    print(f"gateway cuts (its /metrics): {report['gateway_cuts']}")
    print(f"gateway open files: {report['gateway_open_files']}")
    if "open_file_limit" in report:
        print(f"this process's open-file limit: {report['open_file_limit']}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = HoldOptions(
        calls=args.calls,
        concurrency=args.concurrency,
        idle=args.idle,
        slow=args.slow,
        byte_every_s=args.byte_every_s,
        hold_max_s=args.hold_max_s,
        model=args.model,
    )
    if args.url:
        return await measure(args.url.rstrip("/"), args.pid, options, args.rounds)
    port = free_port()
    command = [
        sys.executable, "-m", "lab.gateway_alone", "--port", str(port),
        "--header-timeout-s", str(args.header_timeout_s), "--idle-timeout-s", str(args.idle_timeout_s),
        "--max-connections", str(args.max_connections),
    ]  # fmt: skip
    gateway = subprocess.Popen(command)
    try:
        report = await measure(f"http://127.0.0.1:{port}", gateway.pid, options, args.rounds)
        report["gateway"] = {
            "started": "python -m lab.gateway_alone",
            "header_timeout_s": args.header_timeout_s,
            "idle_timeout_s": args.idle_timeout_s,
            "max_connections": args.max_connections,
        }
        return report
    finally:
        gateway.terminate()
        try:
            gateway.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_hold", description=__doc__.splitlines()[0])
    defaults, gateway = HoldOptions(), GatewayOptions()
    parser.add_argument("--url", default="", help="a running gateway (default: start lab.gateway_alone)")
    parser.add_argument(
        "--pid", type=int, default=None, help="the --url gateway's process, for its open files"
    )
    parser.add_argument("--model", default=defaults.model, help="a model the gateway serves")
    parser.add_argument("--calls", type=int, default=defaults.calls, help="normal calls per phase")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--idle", type=int, default=defaults.idle, help="idle connections held")
    parser.add_argument("--slow", type=int, default=defaults.slow, help="slowloris clients held")
    parser.add_argument("--byte-every-s", type=float, default=defaults.byte_every_s)
    parser.add_argument("--hold-max-s", type=float, default=defaults.hold_max_s)
    parser.add_argument("--rounds", type=int, default=1, help="alone-then-held rounds (then alone once more)")
    parser.add_argument("--header-timeout-s", type=float, default=gateway.header_timeout_s)
    parser.add_argument("--idle-timeout-s", type=float, default=gateway.idle_timeout_s)
    parser.add_argument("--max-connections", type=int, default=gateway.max_connections)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    limit = _fit_open_files(args.idle + 2 * args.slow + args.concurrency + 64)
    report = asyncio.run(run(args))
    report["open_file_limit"] = limit
    _print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
