"""Clients that hold a gateway's connections without calling, and normal calls measured
meanwhile: what ``bench/gateway_hold.py`` prints and the fault suite's ``gateway_slow_clients``
scenario runs.

``Holders``: ``idle`` connections opened and left silent and ``slow`` slowloris clients (each
sends a request's headers one byte every ``byte_every_s``, for ever); a client the gateway cuts
connects again, so as many are held until ``release``; it records each cut (how long the
connection lived, from its first byte for a slow one, and the gateway's status line).
``calls``: normal non-streamed chat calls (8 tokens), ``concurrency`` at a time over kept-alive
connections. ``measure``: ``rounds`` times calls alone, then calls while held (the hold opened
before them, kept until every slow client was cut once or ``hold_max_s``), then alone once more;
alone and held alternate so that a machine whose load drifts weighs on both alike. It reports
each phase's p50 / p99 / mean, the slow clients' cuts, the idle ones cut while held, the
gateway's cuts by reason (its ``/metrics``) and its open files (``/proc/PID/fd``) before, while
held and 2 s after the last hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from lab.gateway_alone import MODEL
from lab.measure import percentile_ms

WARM_UP_CALLS = 200
SLOW_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nX-Slow: "
CUT_REASONS = ("header_timeout", "idle", "over_cap")


def fit_open_files(needed: int) -> dict[str, int]:
    """Raise this process's soft open-file limit to ``needed`` (up to the hard limit, never
    lower); the limits before and after (``soft_before``, ``soft``, ``hard``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = soft
    if 0 <= soft < needed:
        raised = needed if hard < 0 else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    return {"soft_before": soft, "soft": raised, "hard": hard}


@dataclass(frozen=True)
class HoldOptions:
    calls: int = 2000
    concurrency: int = 6
    idle: int = 1000
    slow: int = 10
    byte_every_s: float = 1.0
    hold_max_s: float = 60.0
    model: str = MODEL


class Holders:
    """``idle`` silent connections and ``slow`` slowloris clients to ``host``:``port``, each
    connecting again when cut, until ``release``."""

    def __init__(self, host: str, port: int, options: HoldOptions) -> None:
        self.host, self.port, self.options = host, port, options
        self.holding = True
        self.idle_open = 0
        self.idle_cut: list[float] = []  # seconds each idle connection lived
        self.slow_cut: list[float] = []  # seconds from a slow connection's first byte to its cut
        self.slow_said: Counter[str] = Counter()  # the gateway's status line on each cut
        self.slow_connections = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        opened = [asyncio.Event() for _ in range(self.options.idle)]
        self._tasks = [asyncio.ensure_future(self._idle(event)) for event in opened]
        self._tasks += [asyncio.ensure_future(self._slowloris()) for _ in range(self.options.slow)]
        await asyncio.gather(*(event.wait() for event in opened))

    async def release(self) -> None:
        self.holding = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def _idle(self, opened: asyncio.Event) -> None:
        while self.holding:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._writers.add(writer)
            self.idle_open += 1
            opened.set()
            start = time.monotonic()
            with contextlib.suppress(ConnectionError):
                await reader.read()  # only the gateway's close ends it
            self.idle_cut.append(time.monotonic() - start)
            self.idle_open -= 1
            self._writers.discard(writer)
            writer.close()

    async def _slowloris(self) -> None:
        while self.holding:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._writers.add(writer)
            self.slow_connections += 1
            start = time.monotonic()
            sender = asyncio.ensure_future(self._trickle(writer))
            said = b""
            with contextlib.suppress(ConnectionError):
                said = await reader.read()
            self.slow_cut.append(time.monotonic() - start)
            self.slow_said[said.split(b"\r\n", 1)[0].decode(errors="replace") or "(closed, no answer)"] += 1
            sender.cancel()
            self._writers.discard(writer)
            writer.close()

    async def _trickle(self, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            for byte in SLOW_HEADERS + b"a" * 1_000_000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(self.options.byte_every_s)


@dataclass
class Calls:
    """The wall time of each answered call, and the others' errors."""

    took: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def __add__(self, other: Calls) -> Calls:
        return Calls(self.took + other.took, self.errors + other.errors)

    def summary(self) -> dict[str, Any]:
        return {
            "answered": len(self.took),
            "errors": dict(self.errors),
            "p50_ms": round(percentile_ms(self.took, 0.5), 2),
            "p99_ms": round(percentile_ms(self.took, 0.99), 2),
            "mean_ms": round(1e3 * statistics.fmean(self.took), 2) if self.took else None,
        }


async def calls(url: str, count: int, options: HoldOptions) -> Calls:
    """``count`` chat calls, ``options.concurrency`` at a time."""
    done = Calls()
    body = {
        "model": options.model,
        "messages": [{"role": "user", "content": "a short question for the gateway"}],
        "max_tokens": 8,
    }
    left = count
    connector = aiohttp.TCPConnector(limit=options.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                start = time.monotonic()
                try:
                    async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
                        await answer.read()
                        if answer.status != 200:
                            done.errors[str(answer.status)] += 1
                            continue
                except aiohttp.ClientError as exc:
                    done.errors[type(exc).__name__] += 1
                    continue
                done.took.append(time.monotonic() - start)

        await asyncio.gather(*(worker() for _ in range(options.concurrency)))
    return done


def open_files(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def gateway_cuts(url: str) -> dict[str, float]:
    """The gateway's ``tokenfleet_gateway_connections_cut_total`` by reason (0 if absent)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    cuts = dict.fromkeys(CUT_REASONS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tokenfleet_gateway_connections_cut_total":
                cuts[sample.labels["reason"]] = sample.value
    return cuts


async def _until_answers(url: str, options: HoldOptions, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            if (await calls(url, 1, HoldOptions(concurrency=1, model=options.model))).took:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"the gateway at {url} answered no call within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


async def _held(url: str, pid: int | None, options: HoldOptions) -> tuple[Calls, Holders, dict[str, Any]]:
    """One hold: the connections opened, the calls, the slow clients cut, all let go."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    holders = Holders(host, int(port), options)
    print(f"holding {options.idle} idle and {options.slow} slow connections", file=sys.stderr)
    start = time.monotonic()
    await holders.start()
    await asyncio.sleep(1.0)  # every slow client has sent its first bytes
    seen: dict[str, Any] = {"idle_held": holders.idle_open, "files_held": open_files(pid)}
    done = await calls(url, options.calls, options)
    while len(holders.slow_cut) < options.slow and time.monotonic() - start < options.hold_max_s:
        await asyncio.sleep(0.2)
    seen["hold_s"] = round(time.monotonic() - start, 1)
    await holders.release()
    await asyncio.sleep(2.0)  # the gateway sees the closes
    return done, holders, seen


async def measure(url: str, pid: int | None, options: HoldOptions, rounds: int = 1) -> dict[str, Any]:
    """``rounds`` times calls alone then calls held, then calls alone once more, against the
    gateway at ``url`` (process ``pid``, for its open files)."""
    await _until_answers(url, options, 60.0)
    await calls(url, WARM_UP_CALLS, options)
    cuts_before = await gateway_cuts(url)
    files_before = open_files(pid)
    alone, held, per_round, holds = Calls(), Calls(), [], []
    for _ in range(rounds):
        print(f"alone: {options.calls} calls", file=sys.stderr)
        first = await calls(url, options.calls, options)
        done, holders, seen = await _held(url, pid, options)
        alone, held = alone + first, held + done
        per_round.append({"alone": first.summary(), "held": done.summary()})
        holds.append((holders, seen))
    files_after = open_files(pid)  # every held connection let go 2 s ago
    print(f"alone: {options.calls} calls", file=sys.stderr)
    last = await calls(url, options.calls, options)
    cuts_after = await gateway_cuts(url)

    cut = sorted(t for h, _ in holds for t in h.slow_cut)
    said: Counter[str] = sum((h.slow_said for h, _ in holds), Counter())
    files_held = [seen["files_held"] for _, seen in holds if seen["files_held"] is not None]
    return {
        "url": url,
        "options": asdict(options),
        "rounds": per_round,
        "alone_last": last.summary(),
        "alone": (alone + last).summary(),
        "held": held.summary(),
        "slow": {
            "clients": options.slow,
            "connections": sum(h.slow_connections for h, _ in holds),
            "cut": len(cut),
            "cut_after_s": (
                {
                    "min": round(cut[0], 2),
                    "median": round(statistics.median(cut), 2),
                    "max": round(cut[-1], 2),
                }
                if cut
                else None
            ),
            "answers": dict(said),
        },
        "idle": {
            "held": min(seen["idle_held"] for _, seen in holds),
            "cut_while_held": sum(len(h.idle_cut) for h, _ in holds),
            "hold_s": [seen["hold_s"] for _, seen in holds],
        },
        "gateway_cuts": {r: cuts_after[r] - cuts_before[r] for r in CUT_REASONS},
        "gateway_open_files": {
            "before": files_before,
            "held": max(files_held) if files_held else None,
            "after": files_after,
        },
    }
