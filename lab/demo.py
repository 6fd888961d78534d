"""``tokenfleet demo``: the whole control plane on one machine, end to end.

Starts the embedded broker, a worker process (which owns the embedded ClickHouse store), an
emulated fleet and a load generator over a real trace; shows progress; stops everything in
order (load -> drain -> fleet -> worker); then reads the summary back *from ClickHouse* (after
the worker stopped, since the embedded engine admits one process at a time).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from infra.clickhouse.client import connect
from infra.clickhouse.summary import summary
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from lab.stack import Collector, Stack, publish
from schemas.codec import DecodeError, decode
from schemas.events import AdmissionDecision, Completion
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ, REQUESTS
from sim.evaluation.report import TABLE_WIDTH
from sim.workloads.sources import open_workload
from traffic.loadgen import publish_workload, workload_output_tokens

_MALFORMED = (b"{not json", b'{"request_id": "bad-1", "model": "llama3-8b", "input_tokens": -5}')
_DRAIN_CAP_S = 300.0
"""Longest wait for the last answers after the load (a stuck run, not a normal one)."""
_LOG_EVERY_S = 10.0
"""Off a terminal (a log file, CI), one progress line this often instead of a redrawn bar."""


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """What ``tokenfleet demo`` was asked for; the CLI owns the defaults of workload and fleet."""

    workload: str
    """A trace file or ``synthetic[:k=v,...]``."""
    fleet: str
    """``COUNTxPROFILE[+...]`` or a fleet YAML file."""
    duration: float = 60.0
    """Seconds of load."""
    policy_names: tuple[str, ...] = ()
    """One demo per policy, one after another; empty: round-robin. With several, the last is
    compared with each of the others (its baselines)."""
    rate_scale: float = 1.0
    json_path: Path | None = None
    """Where to write the summary as JSON, if anywhere."""


class Counter(Collector):
    """Counts messages on the output topics, from the end of their logs when it starts, and which
    requests are answered: completed (a completion of any status) or rejected (an admission
    reject)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(
            bootstrap, [DECISIONS, COMPLETIONS, DLQ, ADMISSION], from_start=False, what="demo monitor"
        )
        self.counts = {DECISIONS.name: 0, COMPLETIONS.name: 0, DLQ.name: 0, ADMISSION.name: 0}
        self.answered: set[str] = set()

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        self.counts[topic] += len(records)
        if topic in (COMPLETIONS.name, ADMISSION.name):
            for record in records:
                self._answer(topic, record.value)

    def _answer(self, topic: str, value: bytes | None) -> None:
        try:
            if topic == COMPLETIONS.name:
                self.answered.add(decode(Completion, value).request_id)
            elif (answer := decode(AdmissionDecision, value)).action == "reject":
                self.answered.add(answer.request_id)
        except DecodeError:
            return  # the worker publishes only valid events; nothing to count otherwise


async def _orchestrate(settings: Settings, options: DemoOptions, policy: str, run_id: str) -> dict[str, Any]:
    workload = open_workload(options.workload, seed=0)
    async with Stack(settings.data_dir, partitions=settings.topic_partitions) as stack:
        bootstrap = await stack.start_broker()
        print(f"demo: embedded Kafka (Tansu) on {bootstrap}", file=sys.stderr)
        worker = stack.start_worker(
            log_path=settings.data_dir / "worker.log",
            policy=policy,
            run_id=run_id,
            clickhouse=settings.clickhouse_url,
            # The configured metrics port if it is free, else any free one (see worker.log).
            web_port=settings.worker_web_port if _port_free(settings.worker_web_port) else 0,
        )
        # Traffic starts when everyone listens: the monitor (from the end of the logs), the
        # fleet and the worker (partitions assigned, tables recovered), so TTFT measures
        # scheduling, not start-up.
        counter = Counter(bootstrap)
        await stack.add_collector(counter)
        fleet = await stack.start_dispatcher(
            options.fleet,
            heartbeat_s=settings.heartbeat_interval_s,
            output_tokens=workload_output_tokens(workload),
        )
        await worker.wait_ready_async(timeout_s=90)
        await asyncio.sleep(2 * settings.heartbeat_interval_s + 3)  # heartbeats reached the worker
        await _send_malformed(bootstrap)
        load_task = asyncio.create_task(
            publish_workload(
                KafkaConnection.plaintext(bootstrap),
                workload,
                rate_scale=options.rate_scale,
                duration_s=options.duration,
            )
        )
        started = time.monotonic()
        with LoadProgress(options.duration) as progress:
            while not load_task.done():
                await asyncio.wait({load_task}, timeout=0.5)
                progress.update(time.monotonic() - started, counter.counts)
            published = load_task.result()
            # Drain until every published request is answered (completed or rejected); the cap
            # only guards against a stuck run, and says so.
            drain_until = time.monotonic() + _DRAIN_CAP_S
            while len(counter.answered) < published and time.monotonic() < drain_until:
                await asyncio.sleep(0.2)
                progress.update(time.monotonic() - started, counter.counts, phase="drain")
            if len(counter.answered) < published:
                print(
                    f"demo: {published - len(counter.answered)} of {published} requests still "
                    f"unanswered after {_DRAIN_CAP_S:.0f} s of drain",
                    file=sys.stderr,
                )
            await asyncio.sleep(settings.feedback_flush_s + 1)  # last completions reach the worker's sink
            progress.update(time.monotonic() - started, counter.counts, phase="done")
        await stack.stop_dispatcher()
        fleet.check()
        counter.check()
    # The stack is closed: the worker stopped (its store is free for the summary), the broker too.
    return {
        "requests_published": published,
        "answered": len(counter.answered),
        "decisions": counter.counts[DECISIONS.name],
        "completions": counter.counts[COMPLETIONS.name],
        "dlq": counter.counts[DLQ.name],
    }


async def _send_malformed(bootstrap: str) -> None:
    """Two bad events, to show they land in the dead-letter topic and nothing else stops."""
    await publish(bootstrap, REQUESTS, [(b"llama3-8b", value) for value in _MALFORMED])


class LoadProgress:
    """Live progress on stderr: on a terminal a rich bar over the load duration with the output
    topics' counts; elsewhere (a log file, CI) a line every ``_LOG_EVERY_S`` seconds and one at
    the end, so a log is not flooded with redraws. ``console``: stderr by default."""

    def __init__(self, duration_s: float, console: Console | None = None) -> None:
        self.duration_s = duration_s
        self.console = console or Console(stderr=True, highlight=False)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last: tuple[float, str, Mapping[str, int]] | None = None
        self._logged_at = float("-inf")

    def __enter__(self) -> LoadProgress:
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[demo] {task.description:<5}", markup=False),
                BarColumn(bar_width=30),
                TextColumn("{task.fields[elapsed]:>4.0f}s", markup=False),
                TextColumn(
                    "decisions {task.fields[decisions]}  completions {task.fields[completions]}"
                    "  dlq {task.fields[dlq]}",
                    markup=False,
                ),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "load", total=max(self.duration_s, 1e-9), elapsed=0.0, decisions=0, completions=0, dlq=0
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._last is not None and self._logged_at != self._last[0]:
            self._log(*self._last)  # the final counts, whenever the last periodic line was

    def update(self, elapsed_s: float, counts: Mapping[str, int], phase: str = "load") -> None:
        """``phase``: ``load`` while requests are published, then ``drain``, then ``done``."""
        self._last = (elapsed_s, phase, dict(counts))
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                description=phase,
                completed=min(elapsed_s, self.duration_s),
                elapsed=elapsed_s,
                decisions=counts[DECISIONS.name],
                completions=counts[COMPLETIONS.name],
                dlq=counts[DLQ.name],
            )
        elif elapsed_s - self._logged_at >= _LOG_EVERY_S:
            self._log(elapsed_s, phase, counts)

    def _log(self, elapsed_s: float, phase: str, counts: Mapping[str, int]) -> None:
        self._logged_at = elapsed_s
        clock = f"{elapsed_s:.0f}/{self.duration_s:.0f} s" if phase == "load" else f"{elapsed_s:.0f} s"
        self.console.print(
            Text(
                f"[demo] {phase} {clock}: decisions {counts[DECISIONS.name]},"
                f" completions {counts[COMPLETIONS.name]}, dlq {counts[DLQ.name]}"
            )
        )


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def run_demo(settings: Settings, options: DemoOptions) -> int:
    """One demo per policy (one after another, same load); with two or more, a comparison of
    the last policy with the others (``comparison``).

    The JSON is one run's summary, or ``{"runs": {policy: summary}}`` for several."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    policies = options.policy_names or ("round-robin",)
    results = {policy: _run_once(settings, options, policy) for policy in policies}
    if len(results) > 1:
        print()
        _stdout().print(comparison(results))
    print(f"data: {settings.clickhouse_url} (query it with `tokenfleet sql`, see README)", file=sys.stderr)
    if options.json_path is not None:
        document = next(iter(results.values())) if len(results) == 1 else {"runs": results}
        options.json_path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {options.json_path}", file=sys.stderr)
    return 0 if all(r["decisions"] and r["completions"] for r in results.values()) else 1


def _run_once(settings: Settings, options: DemoOptions, policy: str) -> dict[str, Any]:
    since = time.time()
    run_id = f"demo-{policy}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(since))}"
    print(f"demo: policy {policy}, fleet {options.fleet}, {options.duration:.0f} s of load", file=sys.stderr)
    counts = asyncio.run(_orchestrate(settings, options, policy, run_id))
    client = connect(settings.clickhouse_url)
    try:
        result = {"run_id": run_id, **counts, **summary(client, run_id=run_id)}
    finally:
        client.close()
    print(summary_line(result, policy))
    print()
    _stdout().print(summary_table(result))
    return result


def _stdout() -> Console:
    # Wide enough that rich never wraps a cell however many policies are compared; a table
    # still takes only its natural width.
    return Console(width=TABLE_WIDTH, highlight=False)


def _table(first: str, *others: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column(Text(first), justify="left", no_wrap=True)
    for name in others:
        table.add_column(Text(name), justify="right", no_wrap=True)
    return table


def summary_line(result: Mapping[str, Any], policy: str) -> str:
    """The counts of one run, as one plain line."""
    return (
        f"policy {policy}: published {result['requests_published']}, answered {result['answered']}"
        f" (rejected {result['total'].get('rejected', 0)}), decisions {result['decisions']}, "
        f"completions {result['completions']}, dlq {result['dlq']}, "
        f"clickhouse rows {result['clickhouse_rows']}"
    )


LEGEND = (
    "timed out: its client gave up before the answer ended (its tokens are wasted); a request held "
    "too long is rejected (expired)",
    "TTFT -: the percentile falls on a request that got no first token (it timed out or failed "
    "first), or the class had no requests",
)
"""What the tables' columns and a ``-`` mean, printed under them."""


def summary_table(result: Mapping[str, Any]) -> Group:
    """One run, a row per SLO class: what was answered, rejected, timed out and held, latency
    and goodput; then the top reasons of the rejects and holds, and the ``LEGEND``."""
    table = _table(
        "class",
        "answered",
        "completed",
        "rejected",
        "timed out",
        "held",
        "TTFT p50",
        "TTFT p95",
        "goodput tok/s",
        "compliant",
    )
    reasons: list[str] = []
    for name, row in result["per_class"].items():
        rejected, held = row.get("rejected", 0), row.get("held", 0)
        cells = (
            name,
            str(row.get("requests", 0)),
            str(row.get("completed", 0)),
            str(rejected),
            str(row.get("timeout", 0)),
            str(held),
            _seconds(row.get("ttft_p50_s")),
            _seconds(row.get("ttft_p95_s")),
            f"{row.get('goodput_tokens_per_s', 0.0):.1f}",
            f"{row.get('compliant_share', 0.0):.1%}",
        )
        table.add_row(*(Text(c) for c in cells))  # Text: a name is never read as rich markup
        for kind, key in (("rejected", "rejects_by_reason"), ("held", "holds_by_reason")):
            if row.get(key):
                told = "; ".join(f"{why} ({n})" for why, n in row[key].items())
                reasons.append(f"  {name} {kind}: {told}")
    return Group(table, *(Text(line) for line in [*reasons, *LEGEND]))


def comparison(results: Mapping[str, Mapping[str, Any]]) -> Group:
    """A heading, then per class (and ``all``) a row per policy: goodput, compliant share,
    TTFT p50 / p95, rejects and timeouts; then the last policy's goodput as a ratio to each
    other policy's (its baselines), the strongest baseline (highest goodput) first and named
    so; what each policy's compliant tokens cost (``summary.costs``); the ``LEGEND``."""
    table = _table(
        "class", "policy", "goodput tok/s", "compliant", "TTFT p50", "TTFT p95", "rejected", "timed out"
    )
    table.columns[1].justify = "left"
    classes = sorted({c for r in results.values() for c in r["per_class"]})
    for name in [*classes, "all"]:
        for rank, (policy, r) in enumerate(results.items()):
            row = r.get("total", {}) if name == "all" else r["per_class"].get(name, {})
            cells = (
                name if rank == 0 else "",
                policy,
                f"{row.get('goodput_tokens_per_s', 0.0):.1f}",
                f"{row.get('compliant_share', 0.0):.1%}",
                _seconds(row.get("ttft_p50_s")),
                _seconds(row.get("ttft_p95_s")),
                str(row.get("rejected", 0)),
                str(row.get("timeout", 0)),
            )
            table.add_row(*(Text(c) for c in cells), end_section=rank == len(results) - 1)
    lines: list[RenderableType] = [Text("comparison (same load, read back from ClickHouse)"), table]
    *baselines, product = results

    def goodput(policy: str) -> float:
        return float(results[policy].get("total", {}).get("goodput_tokens_per_s") or 0.0)

    mine = goodput(product)
    for rank, baseline in enumerate(sorted(baselines, key=goodput, reverse=True)):
        base = goodput(baseline)
        ratio = f"{mine / base:.2f}x" if base else "-"
        named = ", the strongest baseline" if rank == 0 and len(baselines) > 1 else ""
        lines.append(Text(f"goodput {product} / {baseline}{named}: {ratio} ({mine:.1f} vs {base:.1f} tok/s)"))
    for policy, r in results.items():
        cost = r.get("cost") or {}
        busy, wasted, idle = (
            cost.get(k, 0.0) for k in ("gpu_seconds_busy", "wasted_gpu_seconds", "gpu_seconds_idle")
        )
        lines.append(
            Text(
                f"cost {policy}: {_dollars(cost.get('cost_per_million_goodput_tokens'))} per million "
                f"compliant tokens (${cost.get('cost', 0.0):.4f}; GPU-seconds busy {busy:.0f}, "
                f"wasted {wasted:.0f}, idle {idle:.0f})"
            )
        )
    lines.extend(Text(line) for line in LEGEND)
    return Group(*lines)


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:.3f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
