"""The gateway scenarios' harness: one scenario's run on a stack started as a user starts it.

A ``GatewayRun`` brings a stack up in its directory with ``local.up`` (what ``tokenfleet up
--engines emulated --servers 2 --policy slomax+tokenpilot --port 0`` does; ``--engines local``
for the real-vLLM scenario), in an environment of its own (every ``TOKENFLEET_*`` setting of the
caller dropped but the engine's Python; data and the worker's embedded store in the run's
directory; the probes on free ports). The supervisor of ``up`` restarts what is killed, as it
does for a user. The run measures with the apparatus of ``lab.faults.gateway_clients`` (the
callers, the probes, the engines' counts) and the fault suite's collector on the stack's broker
(``lab.faults.clients.Collector``, here also reading ``tf.requests``); ``close`` stops the
apparatus and brings the stack down (``local.down``), and ``figures`` counts (definitions:
``lab.faults``). Faults are injected by the pids in the stack's ``state.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.kafka.broker import free_port
from infra.settings import Settings
from lab.faults import log
from lab.faults.clients import Collector
from lab.faults.gateway_clients import Callers, EngineCounts, Probes, engines_of
from lab.faults.gateway_tally import (
    Call,
    answered_twice,
    answered_under_other_id,
    blind_since,
    blind_stretches,
    engine_calls,
    failed,
    failed_by,
    failed_mid_answer,
    lies,
    resumed_after,
    retries,
    started_twice,
    unended,
    wait_p99,
)
from lab.faults.harness import missing_from_store, stored_completions
from lab.faults.tally import FIGURES, Key, count_lost, once_and_twice, recovered_after, rounded, tally
from local import UpOptions, down, up
from local.plan import Plan
from local.state import MARKER_ENV, PLAN_FILE, PartState, StackState, read_state
from schemas.topics import REQUESTS
from worker.ready import read_marker

POLICY = "slomax+tokenpilot"
CALLS = 300  # per run, as the clients made them
CONCURRENCY = 6
KEEP_ENV = ("TOKENFLEET_VLLM_PYTHON",)


class GatewayCollector(Collector):
    """The fault collector, also reading ``tf.requests``: ``recorded`` maps each request's
    (request id, attempt) to its record's timestamp (the deciders publish what they were asked
    directly, with its decision)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.topics.append(REQUESTS)
        self.recorded: dict[Key, float] = {}

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        if topic != REQUESTS.name:
            super().take(topic, records, now)
            return
        for record in records:
            try:
                data = json.loads(record.value or b"")
                self.recorded.setdefault((data["request_id"], data["attempt"]), record.timestamp / 1e3)
            except (ValueError, KeyError, TypeError):
                self.undecodable += 1


@dataclass
class GatewayRun:
    """One gateway scenario's stack and apparatus. The scenario sets the fault's times
    (``fault_start``: the fault injected; ``fault_end``: the faulted part back) and adds figures
    of its own to ``extra``."""

    name: str
    data_dir: Path
    engines: str = "emulated"
    servers: int = 2
    state: StackState | None = None
    collector: GatewayCollector | None = None
    probes: Probes | None = None
    counts: EngineCounts | None = None
    callers: list[Callers] = field(default_factory=list)
    fault_start: float | None = None
    fault_end: float | None = None
    broker_restarted_at: float | None = None
    traffic: tuple[float, float] | None = None  # first call started, last call ended
    extra: dict[str, Any] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)  # started here, beside up's

    @property
    def stack_dir(self) -> Path:
        return self.data_dir / "up"

    @property
    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFLEET_") or k in KEEP_ENV}
        return {
            **base,
            "TOKENFLEET_DATA_DIR": str(self.data_dir / "data"),
            "TOKENFLEET_WORKER_WEB_PORT": "0",
            "TOKENFLEET_DISPATCHER_WEB_PORT": "0",
        }

    # --- lifecycle

    async def start(self) -> StackState:
        """``up`` (every part ready), then the collector, the probes and the engines' counts."""
        self.stack_dir.mkdir(parents=True, exist_ok=True)
        options = UpOptions(
            dir=self.stack_dir, engines=self.engines, servers=self.servers, policy=POLICY, port=0
        )
        self.state = await asyncio.to_thread(self._up, options)
        self.collector = GatewayCollector(self.state.bootstrap)
        await self.collector.start()
        self.probes = Probes(self.state.gateway_url.removesuffix("/v1") + "/ready", self.stack_dir)
        await self.probes.start()
        self.counts = EngineCounts(engines_of(self.state.parts), vllm=self.engines == "local")
        await self.counts.start()
        return self.state

    def _up(self, options: UpOptions) -> StackState:
        # up() reads its settings from the environment and hands it to every part it starts.
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)
        try:
            return up(options, Settings(), say=lambda line: log(f"{self.name}: {line}"))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def callers_for(
        self,
        tag: str,
        concurrency: int = CONCURRENCY,
        max_tokens: tuple[int, int] = (16, 48),
        documents: int = 0,
    ) -> Callers:
        """Callers of the stack's gateway with its local key; their calls are counted."""
        assert self.state is not None
        key = Path(self.state.api_key_file).read_text().strip()
        callers = Callers(
            self.state.gateway_url,
            key,
            self.state.model,
            f"{self.name}-{tag}",
            concurrency=concurrency,
            max_tokens=max_tokens,
            seed=len(self.callers),
            documents=documents,
        )
        self.callers.append(callers)
        return callers

    async def traffic_for(
        self,
        seconds: float,
        calls: int = CALLS,
        tag: str = "c",
        max_tokens: tuple[int, int] = (16, 48),
        documents: int = 0,
    ) -> None:
        """``calls`` calls over ``seconds`` at ``CONCURRENCY`` (the run's traffic; ``documents``:
        ``Callers``')."""
        began = time.time()
        callers = self.callers_for(tag, max_tokens=max_tokens, documents=documents)
        await callers.run(calls, seconds)
        self.traffic = (began if self.traffic is None else self.traffic[0], time.time())

    async def close(self) -> None:
        """Stop the apparatus and bring the stack down; never raises."""
        for callers in self.callers:
            with contextlib.suppress(Exception):
                await callers.close()
        for part in (self.counts, self.probes, self.collector):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        with contextlib.suppress(Exception):
            _, left = await asyncio.to_thread(down, self.stack_dir)
            if left:
                log(f"{self.name}: down left {left} running")
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=10)

    # --- the stack's parts

    def part(self, name: str) -> PartState:
        """The part as ``state.json`` says now."""
        state = read_state(self.stack_dir)
        assert state is not None
        return state.part(name)

    def kill(self, name: str, group: bool = False) -> float:
        """kill -9 of part ``name``'s process (``group``: its whole process group, e.g. vLLM's
        engine core too); returns when."""
        pid = self.part(name).pid
        assert pid is not None
        at = time.time()
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        log(f"{self.name}: killed {name} (pid {pid})")
        return at

    async def back(self, name: str, restarts: int, timeout_s: float = 120.0) -> float:
        """Wait until part ``name`` was restarted (more than ``restarts``) and is ready again;
        returns when it was seen ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            part = self.part(name)
            if part.restarts > restarts and part.state == "ready":
                log(f"{self.name}: {name} back (restart {part.restarts})")
                return time.time()
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{name} was not back within {timeout_s:.0f} s")

    def plan(self) -> Plan:
        return Plan.from_json((self.stack_dir / PLAN_FILE).read_text())

    def decider_pid(self, marker: Path | None = None) -> int:
        """The pid of the serving decider child of the stack's worker (its ready marker's)."""
        path = marker or Path(next(p.restarts_file for p in self.plan().parts if p.kind == "worker"))
        content = read_marker(path)
        assert content is not None, f"no ready marker at {path}"
        return int(content["pid"])

    async def decider_back(self, before: int, timeout_s: float = 120.0) -> float:
        """Wait until the worker's supervisor restarted its decider (``child_restarts`` beyond
        ``before``, as ``state.json`` shows) and its ``/ready`` answers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.part("worker").child_restarts > before:
                log(f"{self.name}: the decider is back")
                return time.time()
            await asyncio.sleep(0.1)
        raise TimeoutError(f"the worker's decider was not back within {timeout_s:.0f} s")

    async def second_worker(self, timeout_s: float = 120.0) -> tuple[subprocess.Popen[bytes], Path]:
        """A second ``tokenfleet worker`` of the stack's scheduler (the same command and settings
        as ``up``'s, its own data dir and port), carrying the stack's marker so ``down`` stops it
        too; returns once it is ready, with its ready marker's path."""
        spec = next(p for p in self.plan().parts if p.kind == "worker")
        port = free_port()
        data = self.data_dir / "second"
        env = {
            **self.env,
            **spec.env,
            "TOKENFLEET_DATA_DIR": str(data),
            "TOKENFLEET_WORKER_WEB_PORT": str(port),
            MARKER_ENV: str(self.stack_dir),
        }
        logfile = (self.stack_dir / "second-worker.log").open("ab")
        process = subprocess.Popen(
            spec.argv, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        logfile.close()
        self.processes.append(process)
        deadline = time.monotonic() + timeout_s
        from local.supervisor import probe

        while not await asyncio.to_thread(probe, f"http://127.0.0.1:{port}/ready"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the second worker did not get ready (log {self.stack_dir}/second-worker.log)"
                )
            await asyncio.sleep(0.5)
        marker = Path(spec.restarts_file.replace(str(self.data_dir / "data"), str(data)))
        return process, marker

    # --- figures

    @property
    def calls(self) -> list[Call]:
        return [c for callers in self.callers for c in callers.calls.values()]

    def figures(self) -> dict[str, Any]:
        """The suite's figures (bus, store) and the gateway path's, at the client."""
        out: dict[str, Any] = dict.fromkeys(FIGURES)
        calls = self.calls
        collector = self.collector
        if not calls or collector is None:
            return {**out, **self.extra}
        out.update(self._bus(collector))
        until = max((c.ended or time.time()) for c in calls)
        span = self.traffic or (min(c.started for c in calls), until)
        blind = blind_stretches(calls, until)
        n_retries, retried = retries(calls)
        out.update(
            never_answered=unended(calls),
            calls=len(calls),
            calls_failed=failed(calls),
            calls_failed_mid_answer=failed_mid_answer(calls),
            answered_twice=answered_twice(calls),
            answered_under_other_id=answered_under_other_id(calls),
            client_retries=n_retries,
        )
        if retried:
            out["retried_after"] = _words(retried)
        why = failed_by(calls)
        if why:
            out["failed_by"] = _words(why)
        since = self.fault_start if self.fault_start is not None else span[0]
        total, longest = blind_since(blind, since)
        out["blind_s"], out["blind_longest_s"] = rounded(total, 2), rounded(longest, 2)
        if self.fault_start is not None and self.fault_end is not None:
            out["resumed_s"] = rounded(resumed_after(blind, self.fault_start, self.fault_end), 2)
            out["answer_p99_s"] = rounded(wait_p99(calls, self.fault_start - 1.0, self.fault_end + 15.0))
        if self.probes is not None:
            ready_blind, unready = lies(self.probes.ready, blind, span)
            out["ready_200_while_blind_s"] = rounded(ready_blind, 1)
            out["ready_503_while_answering_s"] = rounded(unready, 1)
            status_blind, _ = lies(self.probes.status, blind, span)
            out["status_ready_while_blind_s"] = rounded(status_blind, 1)
        out.update(self._engines(collector, calls))
        if collector.error:
            out["collector_error"] = collector.error
        out.update(self.extra)
        return out

    def _bus(self, collector: GatewayCollector) -> dict[str, Any]:
        decided = tally(key for key, _ in {(d.key, d.event_id) for d in collector.decisions})
        executed = tally(key for key, _ in {(k, e) for k, e, _ in collector.completions})
        rejected = {k for k, action in collector.admissions if action == "reject"}
        recorded = set(collector.recorded)
        keys = recorded | set(decided)
        once, twice = once_and_twice(keys, decided)
        out: dict[str, Any] = {
            "published": len(recorded),
            "decided_once": once,
            "decided_twice": twice,
            "executed_twice": once_and_twice(keys, executed)[1],
            "lost": count_lost(recorded, decided, rejected),
            "dead_lettered": len(collector.dead_letters),
            "completions_expected": len({e for _, e, _ in collector.completions}),
            "decided_not_executed": sum(1 for k in decided if k not in executed),
        }
        if rejected:
            out["rejected"] = len(rejected)
        if self.fault_end is not None:
            out["recovered_s"] = rounded(recovered_after(self.fault_end, (d.at for d in collector.decisions)))
        return out

    def _engines(self, collector: GatewayCollector, calls: Sequence[Call]) -> dict[str, Any]:
        """The engines' starts against the attempts the deciders placed."""
        if self.counts is None:
            return {}
        placed: Counter[str] = Counter()
        for request_id, _attempt in {d.key for d in collector.decisions}:
            placed[request_id] += 1
        served = self.counts.served()
        named = engine_calls(served, (c.call_id for c in calls))
        out: dict[str, Any] = {
            "engine_starts": sum(served.values()),
            "attempts_placed": sum(placed.values()),
        }
        if named:
            out["engine_started_twice"] = started_twice(served, named, placed)
        else:  # the engines do not know the calls' ids: only the totals say anything
            out["engine_started_twice"] = None
            out["engine_starts_beyond_placed"] = max(0, out["engine_starts"] - out["attempts_placed"])
        return out

    def dump(self, path: Path) -> None:
        """What the apparatus saw, for a look afterwards (``--keep``): every call and its
        attempts, the probes' samples, the fault's times."""
        probes = self.probes
        document = {
            "fault_start": self.fault_start,
            "fault_end": self.fault_end,
            "calls": [dataclasses.asdict(c) for c in self.calls],
            "ready": [] if probes is None else [(s.at, s.ok) for s in probes.ready],
            "status": [] if probes is None else probes.parts,
        }
        path.write_text(json.dumps(document) + "\n")

    def read_store(self) -> set[str] | None:
        """Completion event ids in the embedded stores of the stack's workers (after ``down``)."""
        return stored_completions(self.data_dir / d / "clickhouse" for d in ("data", "second"))

    def missing_completions(self, stored: set[str]) -> dict[str, int]:
        """Completions seen on ``tf.completions`` and not stored; after a broker restart, also how
        many of those the old broker's log held (the collector read them before the restart)."""
        assert self.collector is not None
        return missing_from_store(self.collector, stored, self.broker_restarted_at is not None)[0]


def _words(counts: dict[str, int]) -> str:
    """A count by reason as one table cell: ``503 x4; APIConnectionError x2``."""
    return "; ".join(f"{k} x{n}" for k, n in counts.items())


GatewayBody = Callable[[GatewayRun], Awaitable[None]]


@dataclass(frozen=True)
class GatewayScenario:
    """A scenario on the gateway path: ``body`` drives a ``GatewayRun`` on a stack of
    ``engines`` (``emulated`` or ``local``: vLLM CPU servers) with ``servers`` engine servers."""

    body: GatewayBody
    engines: str = "emulated"
    servers: int = 2
