"""The lab's measuring instruments for benchmarks that run a stack on this machine: the CPU share
of each process, quantiles in milliseconds, a worker's Prometheus histograms, and measuring with
the garbage collector paused.

Everything runs on one machine, so a benchmark reports the CPU its processes took next to its
figures: a phase where they add up to the cores available measures the machine, not the system.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sim.evaluation.metrics import percentile


@dataclass(frozen=True, slots=True)
class CpuShares:
    """CPU seconds per wall second of each process during one phase (nan where unknown)."""

    worker: float
    broker: float
    bench: float

    def __str__(self) -> str:
        return f"CPU worker {self.worker:.0%}, broker {self.broker:.0%}, bench {self.bench:.0%}"


def percentile_ms(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile (nearest rank, NaN skipped) of seconds, in ms (NaN when empty)."""
    value = percentile(values, 100 * share)
    return math.nan if value is None else 1e3 * value


def scrape_buckets(url: str, histogram: str) -> dict[float, float]:
    """The cumulative bucket counts (upper bound -> count) of ``histogram`` at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{histogram}_bucket"
    }


def bucket_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def histogram_quantile(buckets: dict[float, float], share: float) -> float:
    """Prometheus's estimate: linear inside the bucket the rank falls in (nan when empty)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = share * total, 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the largest finite bound: report that bound
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``); nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid() -> int:
    """The embedded broker: this process's child named ``tansu...``; 0 if there is none."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if name.startswith("tansu") and int(fields[1]) == os.getpid():
            return int(entry.name)
    return 0


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection in this process while it measures.

    This process keeps every payload and every decision it receives, and a full collection
    walks all of them: measured up to 700 ms per collection, during which nothing is published
    or consumed and every request in flight looks that much slower. What it allocates while
    measuring has no reference cycles worth collecting, so nothing piles up.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


class CpuMeter:
    """CPU shares of the worker, the broker and this process from ``start`` to ``stop``."""

    def __init__(self, worker_pid: int) -> None:
        self.pids = (worker_pid, broker_pid())
        self._wall = 0.0
        self._before = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        worker, broker = (cpu_seconds(pid) if pid else math.nan for pid in self.pids)
        return worker, broker, time.process_time()

    def start(self) -> None:
        self._wall, self._before = time.monotonic(), self._now()

    def stop(self) -> CpuShares:
        wall = max(time.monotonic() - self._wall, 1e-9)
        worker, broker, bench = (b - a for a, b in zip(self._before, self._now(), strict=True))
        return CpuShares(worker / wall, broker / wall, bench / wall)
