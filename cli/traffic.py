"""The traffic commands: what publishes to and reads from the services' broker (``loadgen``,
``batch submit``, ``batch results``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.options import (
    EMBEDDED_HELP,
    MAX_SECONDS,
    WORKLOAD_HELP,
    RateScaleOpt,
    check_seed,
    load_settings,
    real,
    require_broker,
    whole,
)

batch_app = typer.Typer(
    help="offline batch jobs\n\n\b\nExample:\n"
    "  TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet batch submit jobs.jsonl --deadline 30m",
    rich_markup_mode=None,
)


def loadgen(
    workload: Annotated[str, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)],
    rate_scale: RateScaleOpt = 1.0,
    model: Annotated[
        str, typer.Option("--model", metavar="NAME", help="model pool the requests are for")
    ] = "llama3-8b",
    limit: Annotated[
        int | None,
        typer.Option("--limit", metavar="N", help="stop after N requests", callback=whole(1)),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            metavar="S",
            help="stop after S seconds of (scaled) arrivals",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = None,
    fast: Annotated[
        bool, typer.Option("--fast", help="publish as fast as possible, not in real time")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", callback=check_seed)] = 0,
    embedded: Annotated[bool, typer.Option("--embedded", help=EMBEDDED_HELP)] = False,
    answers_timeout: Annotated[
        float | None,
        typer.Option(
            "--answers-timeout",
            metavar="S",
            help="then wait up to S seconds for every answer (exit 1 if some never came)",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = None,
    resend_after: Annotated[
        float,
        typer.Option(
            "--resend-after",
            metavar="S",
            help="with --answers-timeout: publish a request again after S seconds without an answer",
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = 30.0,
) -> None:
    """Publish a workload to tf.requests (of the broker TOKENFLEET_KAFKA_BOOTSTRAP names).

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet loadgen --workload synthetic --duration 60
    """
    from infra.kafka.bus import kafka_connection
    from sim.workloads.sources import open_workload
    from traffic.loadgen import publish_and_await, publish_workload

    settings = load_settings()
    require_broker(settings, embedded)
    trace = open_workload(workload, seed=seed)
    options: dict[str, Any] = {
        "rate_scale": rate_scale, "model": model, "limit": limit, "duration_s": duration,
        "realtime": not fast,
    }  # fmt: skip
    with kafka_connection(settings) as connection:
        if answers_timeout is None:
            sent = asyncio.run(publish_workload(connection, trace, **options))
            print(f"published {sent} requests to tf.requests")
            return
        sent, answered, unanswered = asyncio.run(
            publish_and_await(connection, trace, answers_timeout, resend_after, **options)
        )
    print(f"published {sent} requests to tf.requests; {answered} answered, {unanswered} never answered")
    if unanswered:
        raise typer.Exit(1)


@batch_app.command("submit")
def batch_submit(
    file: Annotated[str, typer.Argument(metavar="FILE")],
    deadline: Annotated[str, typer.Option("--deadline", metavar="DURATION", help="e.g. 30m, 2h, 900s")],
    model: Annotated[str, typer.Option("--model", metavar="NAME")] = "llama3-8b",
    embedded: Annotated[bool, typer.Option("--embedded", help=EMBEDDED_HELP)] = False,
) -> None:
    """Publish a JSONL file of requests as one batch job (to TOKENFLEET_KAFKA_BOOTSTRAP's broker).

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet batch submit jobs.jsonl --deadline 30m
    """
    from infra.kafka.bus import kafka_connection
    from traffic.loadgen import parse_duration, publish_batch, read_batch_job

    deadline_s = parse_duration(deadline)
    # The file is read (and a bad one named) before the broker is looked for.
    job = read_batch_job(Path(file), deadline_s, model=model)
    settings = load_settings()
    require_broker(settings, embedded)
    with kafka_connection(settings) as connection:
        asyncio.run(publish_batch(connection, job))
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
            callback=real(0.0, MAX_SECONDS),
        ),
    ] = 60.0,
) -> None:
    """Collect a batch job's answers from tf.responses into a JSONL file.

    \b
    Example:
      TOKENFLEET_KAFKA_BOOTSTRAP=localhost:9092 tokenfleet batch results JOB --out answers.jsonl
    """
    from infra.kafka.batches import collect_results
    from infra.kafka.bus import kafka_connection

    settings = load_settings()
    require_broker(settings, embedded=None)
    with kafka_connection(settings) as connection:
        written, expected = asyncio.run(collect_results(connection, job, Path(out), timeout))
    print(f"{written} of {expected} answers of {job} written to {out}")
    if written < expected:
        raise typer.Exit(1)
