"""``tokenfleet`` command line: the composition root that wires workloads, fleets and policies.

Errors in what the user passed (unknown policy, bad fleet, unreadable trace) print one line
naming the problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.workloads import MOONCAKE

DEMO_TRACE = str(MOONCAKE)


def _simulate(args: argparse.Namespace) -> int:
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.compare import compare
    from sim.evaluation.report import format_table, progress_bar
    from sim.loop.runner import SimConfig
    from sim.workloads.sources import open_workload

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
    from sim.workloads.synthetic import SyntheticMix, write_jsonl

    mix = SyntheticMix(duration_s=args.duration, rate_per_s=args.rate, seed=args.seed)
    count = write_jsonl(mix.generate(), Path(args.out))
    print(f"wrote {count} requests to {args.out}")
    return 0


def _settings(args: argparse.Namespace) -> Any:
    from infra.settings import Settings

    overrides = {k: v for k, v in {"policy": getattr(args, "policy_name", None)}.items() if v is not None}
    return Settings(**overrides)


def _worker(args: argparse.Namespace) -> int:
    from infra.entrypoints.worker import run_worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run_worker(_settings(args), loglevel=args.loglevel)
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from infra.entrypoints.fleet import run_fleet
    from infra.entrypoints.worker import kafka_bootstrap
    from sim.engine.fleet import parse_fleet

    parse_fleet(args.fleet)  # fail fast on a bad spec
    settings = _settings(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with kafka_bootstrap(settings) as bootstrap:
        counts = _run_until_interrupted(
            run_fleet(bootstrap, args.fleet, speed=args.speed, heartbeat_s=settings.heartbeat_interval_s)
        )
    print(f"fleet stopped: {counts}")
    return 0


def _loadgen(args: argparse.Namespace) -> int:
    from infra.entrypoints.loadgen import publish_workload
    from infra.entrypoints.worker import kafka_bootstrap
    from sim.workloads.sources import open_workload

    workload = open_workload(args.workload, seed=args.seed)
    settings = _settings(args)
    with kafka_bootstrap(settings) as bootstrap:
        sent = asyncio.run(
            publish_workload(
                bootstrap,
                workload,
                rate_scale=args.rate_scale,
                model=args.model,
                limit=args.limit,
                duration_s=args.duration,
                realtime=not args.fast,
            )
        )
    print(f"published {sent} requests to tf.requests")
    return 0


def _batch_submit(args: argparse.Namespace) -> int:
    from infra.entrypoints.loadgen import parse_duration, submit_batch
    from infra.entrypoints.worker import kafka_bootstrap

    deadline_s = parse_duration(args.deadline)
    settings = _settings(args)
    with kafka_bootstrap(settings) as bootstrap:
        job = asyncio.run(submit_batch(bootstrap, Path(args.file), deadline_s, model=args.model))
    print(f"submitted batch job {job.job_id}: {len(job.requests)} requests, deadline in {deadline_s:.0f} s")
    return 0


def _schemas_export(args: argparse.Namespace) -> int:
    from schemas.export import export_json_schemas

    for path in export_json_schemas(Path(args.dir)):
        print(path)
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    from infra.clickhouse.client import connect
    from infra.clickhouse.migrate import migrate

    settings = _settings(args)
    client = connect(settings.clickhouse_url)
    try:
        applied = migrate(client)
    finally:
        client.close()
    print("\n".join(applied) if applied else "database is up to date")
    return 0


def _sql(args: argparse.Namespace) -> int:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import connect

    settings = _settings(args)
    client = connect(settings.clickhouse_url)
    try:
        try:
            result = client.query(args.query)
        except ClickHouseError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
        print("\t".join(result.column_names))
        for row in result.result_rows:
            print("\t".join("" if v is None else str(v) for v in row))
    finally:
        client.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from infra.entrypoints.demo import run_demo

    return run_demo(_settings(args), args)


def _run_until_interrupted(coro: Any) -> Any:
    """Run ``coro``; Ctrl-C / SIGTERM cancel it cleanly."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        return None


def build_parser() -> argparse.ArgumentParser:
    from agents.policy import POLICIES
    from sim.evaluation.compare import known_policies

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

    worker = commands.add_parser("worker", help="run the streaming scheduler (Faust worker)")
    worker.add_argument("--policy", dest="policy_name", choices=list(POLICIES), help="routing policy")
    worker.add_argument("--loglevel", default="warn", choices=["crit", "error", "warn", "info", "debug"])
    worker.set_defaults(run=_worker)

    fleet = commands.add_parser("fleet", help="run emulated inference instances in real time")
    fleet.add_argument("--fleet", default="8xllama3-8b-h100", help="COUNTxPROFILE[+...] or a fleet YAML file")
    fleet.add_argument("--speed", type=float, default=1.0, help="emulated time runs X times faster")
    fleet.set_defaults(run=_fleet)

    load = commands.add_parser("loadgen", help="publish a workload to tf.requests")
    load.add_argument("--workload", required=True, help="trace file or 'synthetic[:k=v,...]'")
    load.add_argument("--rate-scale", type=float, default=1.0)
    load.add_argument("--model", default="llama3-8b", help="model pool the requests are for")
    load.add_argument("--limit", type=int, help="stop after N requests")
    load.add_argument("--duration", type=float, help="stop after S seconds of (scaled) arrivals")
    load.add_argument("--fast", action="store_true", help="publish as fast as possible, not in real time")
    load.add_argument("--seed", type=int, default=0)
    load.set_defaults(run=_loadgen)

    batch = commands.add_parser("batch", help="offline batch jobs")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True)
    submit = batch_commands.add_parser("submit", help="publish a JSONL file of requests as one batch job")
    submit.add_argument("file")
    submit.add_argument("--deadline", required=True, help="e.g. 30m, 2h, 900s")
    submit.add_argument("--model", default="llama3-8b")
    submit.set_defaults(run=_batch_submit)

    schemas = commands.add_parser("schemas", help="event contracts")
    schema_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schema_commands.add_parser("export", help="write JSON Schema files for every event")
    export.add_argument("dir")
    export.set_defaults(run=_schemas_export)

    db = commands.add_parser("db", help="the ClickHouse store")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_commands.add_parser("migrate", help="apply pending migrations").set_defaults(run=_db_migrate)

    sql = commands.add_parser("sql", help="run a ClickHouse SQL query on the store (tab-separated output)")
    sql.add_argument("query")
    sql.set_defaults(run=_sql)

    demo = commands.add_parser(
        "demo", help="broker + ClickHouse + worker + emulated fleet + load, end to end"
    )
    demo.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    demo.add_argument(
        "--policy",
        dest="policy_names",
        action="append",
        choices=list(POLICIES),
        help="routing policy (default round-robin); repeat to run the demo once per policy and compare",
    )
    demo.add_argument("--workload", default=DEMO_TRACE, help="trace file or 'synthetic[:k=v,...]'")
    demo.add_argument("--rate-scale", type=float, default=1.0)
    demo.add_argument("--fleet", default="8xllama3-8b-h100")
    demo.add_argument("--json", metavar="OUT", help="write the summary as JSON")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"tokenfleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
