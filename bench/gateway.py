"""Gateway benchmark: what putting TokenFleet in front of real vLLM servers costs per request.

``python -m bench.gateway [--requests N] [--concurrency 1,16] [--max-tokens 8] [--policy P]
[--gateways 4] [--long-prompt-kb 215] [--json OUT]``

Two real vLLM CPU servers (tiny model, random weights), the embedded broker, and the services
each in its own process as deployed: a worker (routing with ``--policy``, default TokenPilot),
``tokenfleet fleet --engine vllm`` and ``tokenfleet gateway``. The official ``openai`` client
(in this process) sends streamed completions, each with a fresh ~120-word prompt (no prefix-cache hit on
either path), ``max_tokens`` tokens with ``ignore_eos``. At each concurrency, every client
alternates: one request straight to an engine (the two in turn), the next through the gateway,
so both paths see the same load on the same servers. TTFT is the client's time to the first
streamed chunk.

The gateway's added latency is split from the decision records on ``tf.decisions``: arrival at
the gateway (the request's ``ts``) -> the worker wrote its decision (the record's timestamp, ms;
the decider answers the gateway directly and records the decision as the answer leaves) is the
gateway's tokenizing + the ask + the worker's share; the policy's own time is the decision's
``decision_latency_s``. The embedded broker's produce -> consume round trip is measured on its
own, with a plain producer and consumer: what each of the two trips a decision through the log
would cost.

Two more phases (JSON ``gateway_cpu`` and ``long_prompt``):

- CPU per call: ``--requests`` calls through the first gateway alone (two clients), its
  process's CPU time per call; then ``--gateways`` gateways (started now), each sent as many
  calls the same way at the same time, the first one's CPU per call again. Also net of its idle
  CPU (measured for 5 s before). Equal: a gateway's cost does not grow with the number of
  gateways (each receives only its own answers).
- Long prompts: concurrency 1 again, while a ``--long-prompt-kb`` KB prompt arrives every 200 ms
  (in turn to an engine and through the gateway). The short calls' added TTFT p50 beside them,
  and the long calls' own added time to the engine's answer (the tiny model takes 4 096 tokens:
  the engine refuses the ~60 000-token prompt once it has tokenized it, on both paths), against
  the time the gateway's tokenizer takes for it (measured here, same tokenizer). The engines
  tokenize the long prompts too (each stalls for ~100 ms), which the scheduler sees and the
  direct calls' fixed turn does not: the short calls' client-side difference mixes that in; the
  gateway's own figure (arrival to first chunk out, less the engine's time) and arrival ->
  decision do not.

Figures go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from openai import AsyncOpenAI, BadRequestError

from infra.kafka.broker import ensure_topics_async, free_port
from infra.kafka.connection import KafkaConnection
from infra.prompts import Prompts
from infra.vllm.inventory import dump_inventory, load_inventory
from lab.engine_stack import StackOptions, worker_options
from lab.measure import bucket_delta, cpu_seconds, histogram_quantile, scrape_buckets
from lab.stack import Stack
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import VllmServers, server_specs
from schemas.codec import DecodeError, decode
from schemas.events import MAX_PROMPT_CHARS, InferenceRequest, RoutingDecision
from schemas.topics import DECISIONS

MODEL = "tiny-llama"
WORDS = (
    "amber",
    "basalt",
    "cedar",
    "dune",
    "ember",
    "fjord",
    "garnet",
    "heron",
    "iris",
    "jade",
    "kelp",
    "lumen",
)


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(120))


async def _one(client: AsyncOpenAI, prompt: str, max_tokens: int, tag: str | None) -> tuple[float, float]:
    """(TTFT, E2E) seconds of one streamed completion."""
    started = time.perf_counter()
    first = None
    headers = {"X-TokenFleet-Tenant": tag} if tag else None
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers=headers,
    )
    async for _chunk in stream:
        if first is None:
            first = time.perf_counter() - started
    return first if first is not None else float("nan"), time.perf_counter() - started


async def _long(client: AsyncOpenAI, prompt: str, tag: str | None) -> float:
    """Seconds to the engine's answer to a prompt beyond its context: its refusal (400)."""
    started = time.perf_counter()
    headers = {"X-TokenFleet-Tenant": tag} if tag else None
    with contextlib.suppress(BadRequestError):
        await client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_headers=headers)
    return time.perf_counter() - started


async def _phase(
    gateway: AsyncOpenAI,
    engines: list[AsyncOpenAI],
    requests: int,
    concurrency: int,
    max_tokens: int,
    tag: str,
) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
    rng = random.Random(concurrency)
    prompts = [_prompt(rng) for _ in range(2 * requests)]
    counter = iter(range(2 * requests))

    async def client_loop() -> None:
        for index in counter:
            path = "gateway" if index % 2 else "direct"
            target = gateway if path == "gateway" else engines[(index // 2) % len(engines)]
            results[path].append(
                await _one(target, prompts[index], max_tokens, tag if path == "gateway" else None)
            )

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return results


async def _broker_round_trip(bootstrap: str, count: int = 200) -> list[float]:
    topic = "tf.bench-roundtrip"
    await ensure_topics_async(KafkaConnection.plaintext(bootstrap), 1, names=[topic])
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=5
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await consumer.start()
    await producer.start()
    try:
        await consumer.seek_to_end()
        samples = []
        for i in range(count):
            started = time.perf_counter()
            await producer.send_and_wait(topic, str(i).encode())
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                if any(r.value == str(i).encode() for records in batch.values() for r in records):
                    break
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        await producer.stop()
        await consumer.stop()


async def _decision_shares(bootstrap: str, tag: str) -> dict[str, Any]:
    """Per gateway request of ``tag``: arrival -> decision written, and the policy's own time."""
    consumer = AIOKafkaConsumer(DECISIONS.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    shares: dict[str, Any] = {"to_decision_s": [], "policy_s": [], "per_instance": {}}
    try:
        idle = 0
        while idle < 5:
            batch = await consumer.getmany(timeout_ms=300, max_records=5000)
            idle = 0 if batch else idle + 1
            for records in batch.values():
                for record in records:
                    if record.value is None or tag.encode() not in record.value:
                        continue
                    try:
                        decision = decode(RoutingDecision, record.value)
                    except DecodeError:
                        continue
                    if decision.tenant == tag:
                        shares["to_decision_s"].append(record.timestamp / 1000 - decision.request.ts)
                        shares["policy_s"].append(decision.decision_latency_s)
                        per = shares["per_instance"]
                        per[decision.instance_id] = per.get(decision.instance_id, 0) + 1
    finally:
        await consumer.stop()
    return shares


@dataclasses.dataclass
class _Deployment:
    """The services as deployed; ``gateways``: their URLs and processes, the first one first."""

    stack: Stack
    env: dict[str, str]
    gateways: list[tuple[str, Any]] = dataclasses.field(default_factory=list)

    def add_gateway(self) -> str:
        port = free_port()
        process = self.stack.start_service(
            ["gateway", "--port", str(port)], self.env, f"gateway-{len(self.gateways)}.log"
        )
        self.gateways.append((f"http://127.0.0.1:{port}", process))
        return self.gateways[-1][0]


@contextlib.asynccontextmanager
async def _deployed(bootstrap: str, inventory: Path, data: Path, policy: str) -> AsyncIterator[_Deployment]:
    """The worker, ``tokenfleet fleet --engine vllm`` and one ``tokenfleet gateway``, each its own
    process as deployed (so the load generator's CPU is not the gateway's), on ``bootstrap``
    (left running)."""
    env = {
        "TOKENFLEET_INVENTORY": str(inventory),
        "TOKENFLEET_SCRAPE_INTERVAL_S": "0.25",
        "TOKENFLEET_DATA_DIR": str(data / "services"),
        "TOKENFLEET_DISPATCHER_WEB_PORT": "0",
        "TOKENFLEET_APP_ID": "bench-gateway",
        # The benchmark stands where an authenticating proxy would: it names each call's tenant.
        "TOKENFLEET_TRUST_TENANT_HEADER": "true",
    }
    options = worker_options(inventory, StackOptions(policy=policy, app_id="bench-gateway"))
    async with Stack(
        data, bootstrap=bootstrap, worker=dataclasses.replace(options, loglevel="warn")
    ) as stack:
        worker = stack.start_worker(data_dir=data / "worker")
        stack.start_service(["fleet", "--engine", "vllm"], env, "fleet.log")
        deployment = _Deployment(stack, env)
        deployment.add_gateway()
        await worker.wait_ready_async(120)
        yield deployment


async def _until_answered(gateway: AsyncOpenAI, timeout_s: float) -> None:
    """Until a call through the gateway is answered (every service up, heartbeats in)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _one(gateway, "warm up", 1, "bench-warmup")
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway answered no call within {timeout_s:.0f} s: {exc}") from exc
            await asyncio.sleep(0.5)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(v for v in values if v == v)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def _added_p50_interval(
    through: list[float], direct: list[float], resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95 % bootstrap interval of p50(through) - p50(direct): each path's calls resampled with
    replacement, ``resamples`` times (how far the figure could move on another run of the same
    size: TTFTs under load spread over hundreds of ms, so 100 calls a path move it by ~10 ms)."""
    rng = random.Random(seed)
    diffs = sorted(
        _q(rng.choices(through, k=len(through)), 0.5) - _q(rng.choices(direct, k=len(direct)), 0.5)
        for _ in range(resamples)
    )
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


def _added_buckets(deployment: _Deployment) -> dict[float, float]:
    """The first gateway's histogram of what it adds to a call's TTFT (its own measure)."""
    return scrape_buckets(deployment.gateways[0][0] + "/metrics", "tokenfleet_gateway_added_seconds")


def _client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=60)


async def run(
    requests: int,
    concurrencies: list[int],
    max_tokens: int,
    policy: str,
    gateways: int,
    long_kb: int,
    engine_nice: int = 0,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tokenfleet-gateway-bench-") as tmp:
        data = Path(tmp)
        model_dir = ensure_tiny_model(data / "model", MODEL)
        servers = VllmServers(
            server_specs(2), model_dir, data / "servers", served_model_name=MODEL, nice=engine_nice
        )
        print("bench: starting 2 vLLM servers", file=sys.stderr)
        with servers:
            async with Stack(data, partitions=4) as lab:
                bootstrap = await lab.start_broker()
                inventory = data / "inventory.yaml"
                inventory.write_text(dump_inventory(servers.inventory()))
                async with _deployed(bootstrap, inventory, data, policy) as deployment:
                    gateway = _client(deployment.gateways[0][0])
                    engines = [_client(i.url) for i in load_inventory(inventory).instances]
                    await _until_answered(gateway, 120)
                    print("bench: warm-up", file=sys.stderr)
                    await _phase(gateway, engines, 10, 2, max_tokens, "bench-warmup")
                    report: dict[str, Any] = {
                        "requests_per_path": requests, "max_tokens": max_tokens, "policy": policy,
                        "engine_nice": engine_nice, "runs": {},
                    }  # fmt: skip
                    for concurrency in concurrencies:
                        tag = f"bench-c{concurrency}"
                        print(
                            f"bench: concurrency {concurrency}, {requests} requests per path", file=sys.stderr
                        )
                        before = _added_buckets(deployment)
                        results = await _phase(gateway, engines, requests, concurrency, max_tokens, tag)
                        report["runs"][str(concurrency)] = await _summary(results, bootstrap, tag)
                        report["runs"][str(concurrency)]["gateway_own_added_p50_s"] = histogram_quantile(
                            bucket_delta(_added_buckets(deployment), before), 0.5
                        )
                        print(f"bench: {json.dumps(report['runs'][str(concurrency)])}", file=sys.stderr)
                    if long_kb:
                        before = _added_buckets(deployment)
                        report["long_prompt"] = await _long_prompts(
                            gateway, engines, requests, max_tokens, bootstrap, long_kb, model_dir
                        )
                        report["long_prompt"]["short"]["gateway_own_added_p50_s"] = histogram_quantile(
                            bucket_delta(_added_buckets(deployment), before), 0.5
                        )
                    if gateways > 1:
                        report["gateway_cpu"] = await _gateway_cpu(deployment, requests, max_tokens, gateways)
                    for c in (gateway, *engines):
                        await c.close()
                round_trips = await _broker_round_trip(bootstrap)
                report["broker_round_trip_p50_s"] = statistics.median(round_trips)
                report["broker_round_trip_p99_s"] = _q(round_trips, 0.99)
    return report


async def _summary(results: dict[str, list[tuple[float, float]]], bootstrap: str, tag: str) -> dict[str, Any]:
    shares = await _decision_shares(bootstrap, tag)
    direct = [t for t, _ in results["direct"]]
    through = [t for t, _ in results["gateway"]]
    return {
        "direct_ttft_p50_s": _q(direct, 0.5),
        "direct_ttft_p99_s": _q(direct, 0.99),
        "gateway_ttft_p50_s": _q(through, 0.5),
        "gateway_ttft_p99_s": _q(through, 0.99),
        "added_p50_s": _q(through, 0.5) - _q(direct, 0.5),
        "added_p50_interval_s": _added_p50_interval(through, direct),
        "added_p99_s": _q(through, 0.99) - _q(direct, 0.99),
        "to_decision_p50_s": _q(shares["to_decision_s"], 0.5),
        "policy_p50_s": _q(shares["policy_s"], 0.5),
        "decisions_seen": len(shares["to_decision_s"]),
        "gateway_per_instance": shares["per_instance"],
    }


async def _long_prompts(
    gateway: AsyncOpenAI,
    engines: list[AsyncOpenAI],
    requests: int,
    max_tokens: int,
    bootstrap: str,
    kb: int,
    model_dir: Path,
) -> dict[str, Any]:
    """Short calls at concurrency 1 while a ``kb`` KB prompt arrives every 200 ms, in turn
    straight to an engine and through the gateway."""
    text = _long_text(kb)
    prompts = Prompts.from_dirs({MODEL: model_dir})
    request = InferenceRequest(request_id="long", model=MODEL, prompt=text, output_budget=1)
    tokenize = []
    for _ in range(3):
        started = time.perf_counter()
        tokens = prompts.complete(request).input_tokens
        tokenize.append(time.perf_counter() - started)
    long_times: dict[str, list[float]] = {"direct": [], "gateway": []}
    stop = asyncio.Event()
    tasks: list[tuple[str, asyncio.Future[float]]] = []

    async def long_calls() -> None:
        index = 0
        while not stop.is_set():
            path = "gateway" if index % 2 else "direct"
            target = gateway if path == "gateway" else engines[(index // 2) % len(engines)]
            tag = "bench-long-prompt" if path == "gateway" else None
            tasks.append((path, asyncio.ensure_future(_long(target, text, tag))))
            index += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    print(f"bench: long prompts ({kb} KB, {tokens} tokens) every 200 ms beside short calls", file=sys.stderr)
    sender = asyncio.ensure_future(long_calls())
    results = await _phase(gateway, engines, requests, 1, max_tokens, "bench-long")
    stop.set()
    await sender
    for path, task in tasks:
        long_times[path].append(await task)
    summary = await _summary(results, bootstrap, "bench-long")
    return {
        "prompt_bytes": len(text.encode()),
        "prompt_tokens": tokens,
        "tokenize_s": statistics.median(tokenize),
        "long_calls": {path: len(times) for path, times in long_times.items()},
        "long_direct_p50_s": _q(long_times["direct"], 0.5),
        "long_gateway_p50_s": _q(long_times["gateway"], 0.5),
        "long_added_p50_s": _q(long_times["gateway"], 0.5) - _q(long_times["direct"], 0.5),
        "short": summary,
    }


def _long_text(kb: int) -> str:
    """``kb`` KB of the project's own sources (at most 200 000 characters: a prompt's limit)."""
    sources = "".join(
        p.read_text() for p in sorted(Path(__file__).resolve().parents[1].rglob("agents/**/*.py"))
    )
    text = (sources * (kb * 1024 // len(sources) + 1))[: kb * 1024]
    return text[:MAX_PROMPT_CHARS]


async def _gateway_cpu(
    deployment: _Deployment, requests: int, max_tokens: int, gateways: int
) -> dict[str, Any]:
    """The first gateway's CPU seconds per call of its own, with the same calls sent to it the
    same way (one client after another, two at a time): first alone, then while ``gateways``
    - 1 more gateways get as many calls each. Also net of what the gateway spends idle (its
    CPU per second without calls, measured first, times the phase's duration)."""
    first_url, first = deployment.gateways[0]
    pid = first.process.pid
    print(f"bench: CPU per call, 1 gateway then {gateways}", file=sys.stderr)
    idle_from, idle_at = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(5.0)
    idle_per_s = (cpu_seconds(pid) - idle_from) / (time.monotonic() - idle_at)

    async def drive(urls: list[str]) -> tuple[float, float]:
        """(gross, net) CPU seconds per call of the first gateway, ``requests`` calls to each."""
        rng = random.Random(7)
        clients = [_client(u) for u in urls]

        async def calls(client: AsyncOpenAI) -> None:
            for _ in range(requests // 2):
                await _one(client, _prompt(rng), max_tokens, "bench-cpu")

        before, started = cpu_seconds(pid), time.monotonic()
        await asyncio.gather(*(calls(c) for c in clients for _ in range(2)))
        used, wall = cpu_seconds(pid) - before, time.monotonic() - started
        for c in clients:
            await c.close()
        calls_made = 2 * (requests // 2)
        return used / calls_made, (used - idle_per_s * wall) / calls_made

    lone, lone_net = await drive([first_url])
    for _ in range(gateways - 1):
        await _until_answered(_client(deployment.add_gateway()), 120)
    beside, beside_net = await drive([url for url, _ in deployment.gateways])
    return {
        "gateways": len(deployment.gateways),
        "idle_cpu_per_s": idle_per_s,
        "lone_cpu_per_call_s": lone,
        "beside_cpu_per_call_s": beside,
        "ratio": beside / lone,
        "lone_net_cpu_per_call_s": lone_net,
        "beside_net_cpu_per_call_s": beside_net,
        "net_ratio": beside_net / lone_net,
    }


def _print(report: dict[str, Any]) -> None:
    ms = 1000.0
    print(
        f"gateway benchmark ({report['policy']}): {report['requests_per_path']} requests per path,"
        f" max_tokens {report['max_tokens']}"
    )
    print(f"{'conc':>4}  {'direct p50':>10} {'p99':>7}  {'gateway p50':>11} {'p99':>7}  {'added p50':>9}"
          f" {'(95 % interval)':>15} {'p99':>7}  {'own p50':>7}  {'to decision':>11}"
          f" {'policy':>7}")  # fmt: skip
    for concurrency, r in report["runs"].items():
        low, high = r["added_p50_interval_s"]
        print(
            f"{concurrency:>4}  {r['direct_ttft_p50_s'] * ms:>8.1f}ms {r['direct_ttft_p99_s'] * ms:>5.1f}ms"
            f"  {r['gateway_ttft_p50_s'] * ms:>9.1f}ms {r['gateway_ttft_p99_s'] * ms:>5.1f}ms"
            f"  {r['added_p50_s'] * ms:>7.1f}ms {f'({low * ms:.1f} to {high * ms:.1f})':>15}"
            f" {r['added_p99_s'] * ms:>5.1f}ms"
            f"  {r['gateway_own_added_p50_s'] * ms:>5.1f}ms"
            f"  {r['to_decision_p50_s'] * ms:>9.1f}ms"
            f" {r['policy_p50_s'] * ms:>5.2f}ms  routed {r['gateway_per_instance']}"
        )
    if "long_prompt" in report:
        lp = report["long_prompt"]
        print(
            f"long prompts ({lp['prompt_bytes'] // 1024} KB, {lp['prompt_tokens']} tokens, every 200 ms):"
            f" short calls added p50 {lp['short']['added_p50_s'] * ms:.1f} ms"
            f" (the gateway's own {lp['short']['gateway_own_added_p50_s'] * ms:.1f} ms,"
            f" to decision {lp['short']['to_decision_p50_s'] * ms:.1f} ms);"
            f" long call added p50 {lp['long_added_p50_s'] * ms:.1f} ms"
            f" (tokenizing it {lp['tokenize_s'] * ms:.1f} ms; calls {lp['long_calls']})"
        )
    if "gateway_cpu" in report:
        cpu = report["gateway_cpu"]
        print(
            f"gateway CPU per call: alone {cpu['lone_cpu_per_call_s'] * ms:.2f} ms,"
            f" beside {cpu['gateways'] - 1} more {cpu['beside_cpu_per_call_s'] * ms:.2f} ms"
            f" ({cpu['ratio']:.2f}x); net of idle ({cpu['idle_cpu_per_s'] * 100:.1f} % of a core)"
            f" {cpu['lone_net_cpu_per_call_s'] * ms:.2f} / {cpu['beside_net_cpu_per_call_s'] * ms:.2f} ms"
            f" ({cpu['net_ratio']:.2f}x)"
        )
    print(
        f"embedded broker produce->consume round trip: p50 {report['broker_round_trip_p50_s'] * ms:.1f} ms,"
        f" p99 {report['broker_round_trip_p99_s'] * ms:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=1000,
        help="requests per path per concurrency (the added p50's 95 %% interval is printed beside it)",
    )
    parser.add_argument("--concurrency", default="1,16", help="comma-separated client concurrencies")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--policy", default="tokenpilot", help="the worker's routing policy")
    parser.add_argument(
        "--gateways", type=int, default=4, help="gateways of the CPU-per-call phase (1: skip it)"
    )
    parser.add_argument(
        "--long-prompt-kb", type=int, default=215, help="the long-prompt phase's prompt, KB (0: skip it)"
    )
    parser.add_argument(
        "--engine-nice",
        type=int,
        default=0,
        choices=range(20),
        metavar="0-19",
        help="the vLLM servers' CPU niceness (they share this machine's cores with every service)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    report = asyncio.run(
        run(
            args.requests,
            concurrencies,
            args.max_tokens,
            args.policy,
            args.gateways,
            args.long_prompt_kb,
            args.engine_nice,
        )
    )
    _print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
