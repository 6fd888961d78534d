"""Engines for ``python -m bench.replay``: emulated vLLM servers started as processes, one policy
run through an ``EngineStack`` under a run id, and what the engines' ``/metrics`` count.

``EmulatedServers`` starts ``count`` servers of ``local.emulated_vllm`` (one engine profile, one
speed, the tiny model's tokenizer, KV events on), waits until each answers ``/health`` and
gives their inventory. It has no prefix-cache reset: start a fresh set for a cold cache.

``run_policy`` is one policy on a running fleet: an ``EngineStack`` (worker with the store,
dispatcher, gateway) whose worker stamps ``run_id`` on every row, the ``openai`` client load of
``lab.demo_vllm.load`` through its gateway, then the wait for the last rows to reach the store.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from infra.vllm.inventory import InstanceEntry, Inventory, ModelEntry
from lab.demo_vllm import hit_rates, load, prefix_counters
from lab.engine_stack import EngineStack, StackOptions
from local.vllm_launcher import HOST, free_ports
from sim.engine.profiles import PROFILES

STARTUP_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


class EmulatedServers:
    """``count`` emulated vLLM servers ``emulated-0`` .. of ``profile`` at ``speed`` (emulated time
    runs that many times faster than the clock), serving ``model`` with the tokenizer of
    ``tokenizer_dir``; logs in ``data_dir``. A context manager: started on entry (every server
    healthy, else ``RuntimeError`` naming the one that is not, all stopped), stopped on exit."""

    def __init__(
        self, count: int, profile: str, speed: float, model: str, tokenizer_dir: Path, data_dir: Path
    ) -> None:
        self.profile = profile
        self.speed = speed
        self.model = model
        self.tokenizer_dir = tokenizer_dir
        self.data_dir = data_dir
        ports = free_ports(3 * count)
        self.ports = {f"emulated-{i}": tuple(ports[3 * i : 3 * i + 3]) for i in range(count)}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def url(self, instance_id: str) -> str:
        return f"http://{HOST}:{self.ports[instance_id][0]}"

    def inventory(self) -> Inventory:
        """The servers as the dispatcher and the worker read them (KV events on each, their
        profile's scheduler limits)."""
        profile = PROFILES[self.profile]
        instances = tuple(
            InstanceEntry(
                instance_id=name,
                url=self.url(name),
                model=self.model,
                version="v1",
                dc="local",
                served_model_name=self.model,
                kv_events=f"tcp://{HOST}:{events}",
                kv_replay=f"tcp://{HOST}:{replay}",
                max_num_seqs=profile.max_seqs,
                max_num_batched_tokens=profile.prefill_budget_tokens,
            )
            for name, (_http, events, replay) in self.ports.items()
        )
        return Inventory({self.model: ModelEntry(self.model, "v1", self.tokenizer_dir)}, instances)

    def __enter__(self) -> EmulatedServers:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            for name, (http, events, replay) in self.ports.items():
                log = (self.data_dir / f"{name}.log").open("ab")
                self._logs.append(log)
                argv = [sys.executable, "-m", "local.emulated_vllm", "--port", str(http)]
                argv += ["--profile", self.profile, "--served-model-name", self.model]
                argv += ["--tokenizer", str(self.tokenizer_dir), "--speed", f"{self.speed:g}"]
                argv += ["--kv-events", f"tcp://{HOST}:{events}", "--kv-replay", f"tcp://{HOST}:{replay}"]
                self._processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for name, process in self._processes.items():
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({process.returncode}): see {self.data_dir / name}.log"
                    )
                try:
                    with urllib.request.urlopen(self.url(name) + "/health", timeout=2):
                        break
                except (urllib.error.URLError, OSError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} not healthy after {STARTUP_TIMEOUT_S:.0f} s") from None
                    time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to each server (SIGKILL after ``STOP_GRACE_S``), then close the logs."""
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes.values():
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._processes = {}
        for log in self._logs:
            log.close()
        self._logs = []


@dataclass(frozen=True)
class PolicyRun:
    """One policy's run: ``run_id`` (the store's), the clients' figures (``lab.demo_vllm.load``)
    and the engines' prefix-cache counts (``hit_rates``)."""

    policy: str
    run_id: str
    client: dict[str, Any]
    engines: dict[str, Any]


async def run_policy(
    bootstrap: str,
    inventory_path: Path,
    data_dir: Path,
    store_url: str,
    policy: str,
    load_options: tuple[float, int, int],
    flush_s: float = 1.0,
) -> PolicyRun:
    """``policy`` routing the fleet of ``inventory_path`` for ``load_options`` = (duration s,
    users, seed) of ``lab.demo_vllm.load``, every row in the store at ``store_url`` under a run
    id of its own; returns after the stack stopped (the store is free to read)."""
    duration_s, users, seed = load_options
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_id = f"bench-replay-{policy}-{stamp}-{os.getpid()}"
    options = StackOptions(
        policy=policy,
        clickhouse=store_url,
        app_id=f"bench-replay-{policy.replace('+', '-')}-{time.time_ns() % 10**6}",
        worker_settings={"TOKENFLEET_RUN_ID": run_id},
        trust_tenant_header=True,  # each user is a tenant, named by its header
    )
    async with EngineStack(bootstrap, inventory_path, data_dir / policy.replace("+", "-"), options) as stack:
        before = prefix_counters(stack.inventory)
        client = await load(stack.gateway_url, duration_s, users, seed)
        await asyncio.sleep(flush_s + 1.5)  # the last completions reach the store
        engines = hit_rates(before, prefix_counters(stack.inventory))
    return PolicyRun(policy, run_id, client, engines)
