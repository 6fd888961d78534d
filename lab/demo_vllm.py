"""``tokenfleet demo --engine vllm``: TokenFleet in front of two real vLLM servers, end to end.

Creates the tiny model (random weights, a tokenizer trained here), starts two vLLM CPU servers
(``make engine`` installs vLLM), the embedded broker, and per policy an ``EngineStack`` (worker
with the embedded ClickHouse store, dispatcher, gateway). The load is the official ``openai``
client: ``concurrency`` users, each a tenant with a long system prompt of its own, sending
streamed chats (``max_tokens`` 16-64) for ``duration`` seconds, each call after the user's
previous one ended; each names itself (``user``), so the store records its calls as one session.
Between policies the servers' prefix caches are reset, so every policy starts cold on the same
load (same seed). Prints, per policy, what the clients measured (TTFT p50/p95), what the engines
counted (prefix-cache hit rate), and the summary read back from ClickHouse.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from rich.console import Console

from dispatcher.engines.vllm.metrics import parse_metrics
from infra.clickhouse.client import connect
from infra.clickhouse.summary import summary
from infra.settings import Settings
from infra.vllm.inventory import Inventory, dump_inventory
from lab.demo import comparison, summary_table
from lab.engine_stack import EngineStack, StackOptions
from lab.stack import broker
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import VllmServers, engine_python_or_none, server_specs
from sim.evaluation.report import TABLE_WIDTH

MODEL = "tiny-llama"


@dataclass(frozen=True)
class VllmDemoOptions:
    duration: float = 60.0
    policy_names: tuple[str, ...] = ("round-robin", "tokenpilot")
    concurrency: int = 8
    servers: int = 2
    json_path: Path | None = None
    seed: int = 0


def run_vllm_demo(settings: Settings, options: VllmDemoOptions) -> int:
    python = engine_python_or_none()
    if python is None:
        from local.vllm_launcher import ENGINE_MISSING

        raise ValueError(ENGINE_MISSING)
    data = settings.data_dir.resolve() / "vllm-demo"
    data.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_tiny_model(data / "model", MODEL)
    print(f"demo: starting {options.servers} vLLM servers (CPU, {model_dir.name}); ~30-60 s", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    servers = VllmServers(
        server_specs(options.servers),
        model_dir,
        data / "servers",
        served_model_name=MODEL,
        python=python,
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between policies
    )
    with servers, broker(partitions=settings.topic_partitions, log_path=data / "tansu.log") as bootstrap:
        inventory = data / "inventory.yaml"
        inventory.write_text(dump_inventory(servers.inventory()))
        print(
            f"demo: servers up in {max(servers.startup_s.values()):.0f} s; inventory {inventory}",
            file=sys.stderr,
        )
        for policy in options.policy_names:
            _reset_prefix_caches(servers)
            results[policy] = asyncio.run(_run_once(bootstrap, inventory, data, settings, options, policy))
    for policy, result in results.items():
        print(_line(policy, result))
    print()
    console = Console(width=TABLE_WIDTH, highlight=False)
    if len(results) > 1:
        console.print(comparison(results))
    else:
        console.print(summary_table(next(iter(results.values()))))
    if options.json_path is not None:
        options.json_path.write_text(json.dumps({"runs": results}, indent=2) + "\n")
        print(f"wrote {options.json_path}", file=sys.stderr)
    return 0 if all(r["client"]["ok"] for r in results.values()) else 1


async def _run_once(
    bootstrap: str, inventory: Path, data: Path, settings: Settings, options: VllmDemoOptions, policy: str
) -> dict[str, Any]:
    run_id = f"vllm-demo-{policy}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    clickhouse = settings.clickhouse_url
    stack_options = StackOptions(
        policy=policy,
        clickhouse=clickhouse,
        app_id=f"vllm-demo-{policy.replace('+', '-')}-{time.time_ns() % 10**6}",
        worker_settings={"TOKENFLEET_RUN_ID": run_id},
        trust_tenant_header=True,  # each user is a tenant, named by its header
    )
    print(
        f"demo: policy {policy}: {options.duration:.0f} s of load, {options.concurrency} users",
        file=sys.stderr,
    )
    async with EngineStack(bootstrap, inventory, data / policy.replace("+", "-"), stack_options) as stack:
        before = prefix_counters(stack.inventory)
        client_side = await load(stack.gateway_url, options.duration, options.concurrency, options.seed)
        await asyncio.sleep(settings.feedback_flush_s + 1.5)  # the last completions reach the store
        engines = hit_rates(before, prefix_counters(stack.inventory))
    store = connect(clickhouse)
    try:
        stored = summary(store, run_id=run_id)
    finally:
        store.close()
    return {"run_id": run_id, "policy": policy, "client": client_side, "engines": engines, **stored}


async def load(gateway_url: str, duration_s: float, concurrency: int, seed: int) -> dict[str, Any]:
    """``concurrency`` users chatting through the gateway for ``duration_s``; client-side figures."""
    client = AsyncOpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    rng = random.Random(seed)
    systems = [_system_prompt(rng, user) for user in range(concurrency)]
    ttfts: list[float] = []
    counts = {"ok": 0, "failed": 0}
    deadline = time.monotonic() + duration_s

    async def user(index: int) -> None:
        turn = 0
        local = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline:
            turn += 1
            started = time.perf_counter()
            first = None
            try:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=[
                        {"role": "system", "content": systems[index]},
                        {"role": "user", "content": f"question {turn} of user {index}"},
                    ],
                    max_tokens=local.randint(16, 64),
                    stream=True,
                    extra_body={"ignore_eos": True},
                    extra_headers={"X-TokenFleet-Tenant": f"user-{index}"},
                    user=f"user-{index}",  # the store keeps its calls as one session (a hash)
                )
                async for _chunk in stream:
                    if first is None:
                        first = time.perf_counter() - started
                counts["ok"] += 1
                if first is not None:
                    ttfts.append(first)
            except Exception as exc:  # a failed call is counted, the user goes on
                counts["failed"] += 1
                print(f"demo: user {index}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
                await asyncio.sleep(0.5)

    await asyncio.gather(*(user(i) for i in range(concurrency)))
    await client.close()
    ttfts.sort()
    return {**counts, "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p95_s": _quantile(ttfts, 0.95)}


def _system_prompt(rng: random.Random, user: int) -> str:
    """A user's own long system prompt (90 rules of six words: several 512-token blocks with the
    demo's tokenizer): what makes routing by cache pay."""
    words = ["ledger", "harbour", "quartz", "meadow", "lantern", "cipher", "orchard", "falcon", "mosaic"]
    rules = " ".join(f"rule {i}: {' '.join(rng.choice(words) for _ in range(6))}." for i in range(90))
    return f"You are assistant number {user}. {rules}"


def prefix_counters(inventory: Inventory) -> dict[str, tuple[int, int, int]]:
    """Each instance's prefix-cache (queried, hit) token counters and its pre-emptions, from its
    ``/metrics`` (cumulative)."""
    found = {}
    for entry in inventory.instances:
        with urllib.request.urlopen(entry.url + "/metrics", timeout=5) as answer:
            metrics = parse_metrics(answer.read().decode(), entry.served_model_name)
        found[entry.instance_id] = (
            metrics.prefix_cache_queries,
            metrics.prefix_cache_hits,
            metrics.preemptions,
        )
    return found


def hit_rates(
    before: Mapping[str, tuple[int, int, int]], after: Mapping[str, tuple[int, int, int]]
) -> dict[str, Any]:
    """Per instance, between two ``prefix_counters``: the prefix-cache tokens queried and hit,
    their ratio (0 when none was queried) and the pre-emptions."""
    rates = {}
    for name, (queries, hits, preempted) in after.items():
        q, h = queries - before[name][0], hits - before[name][1]
        rates[name] = {
            "prefix_queries": q,
            "prefix_hits": h,
            "hit_rate": round(h / q, 4) if q else 0.0,
            "preemptions": preempted - before[name][2],
        }
    return rates


def _reset_prefix_caches(servers: VllmServers) -> None:
    for spec in servers.specs:
        request = urllib.request.Request(servers.url(spec.instance_id) + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of ``values`` to 0.1 ms: the project's one percentile (nearest
    rank), the simulator's."""
    from sim.evaluation.metrics import percentile

    value = percentile(values, 100 * q)
    return None if value is None else round(value, 4)


def _line(policy: str, result: dict[str, Any]) -> str:
    c = result["client"]
    rates = ", ".join(f"{k} {v['hit_rate']:.0%}" for k, v in result["engines"].items())
    return (
        f"policy {policy}: {c['ok']} answered, {c['failed']} failed; client TTFT p50 {c['ttft_p50_s']} s, "
        f"p95 {c['ttft_p95_s']} s; prefix-cache hit rate {rates}; clickhouse rows {result['clickhouse_rows']}"
    )
