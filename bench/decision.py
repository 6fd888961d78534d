"""Benchmark: in-process routing decision latency on large pools with full prefix caches.

For each pool size it builds one model pool of N llama3-8b-h100 instances, fills the policy's
prefix index so every instance holds ``--blocks-per-instance`` cached blocks, and then times
``scheduler.submit([request], view, now)`` (``time.perf_counter_ns``) for ``--decisions`` requests,
with everything a real router does between two decisions fed to the policy too (untimed, but
reported separately): the KV events of the instance the previous requests went to (its new
blocks stored, as many of its old ones removed), the completions of requests sent about half
a second earlier, and a fresh heartbeat snapshot every N decisions (each instance gets ~4
requests/s, heartbeats every 0.25 s). Printed per pool: p50 / p99 / max decision latency,
decisions per second (1 / mean latency), the per-decision update cost, index build time and
memory (RSS growth while building the index).

Views come through the streaming worker's own view builder (``streams.snapshot.SnapshotCache``):
every heartbeat round updates the cache one heartbeat at a time, and every decision asks it for
the pool's view, as the worker does per request batch. Printed: the view cost per batch when no
heartbeat arrived since the previous one (``view p50`` / ``view p99``; target <= 1 ms at 4 096),
the first view after a heartbeat round (``rebuild``, us), the cost of one heartbeat update
(``beat us``) and the very first view, built from the recorded heartbeats (``first ms``, what
a worker pays once per pool after a start or a rebalance).

Cache content (what a large pool serving one model holds; deliberately not easy):

- a *universe* of ``--conversations`` conversations (default 200 000). Each prompt chain is
  ``system prompt + (document) + conversation body``: 32 system prompts of 1-8 blocks (Zipf
  s=1.0 over them, so a few are on nearly every instance), a document for half of the
  conversations (5 000 documents of lognormal length, median 8 blocks, Zipf s=1.0), and a body
  of lognormal length (median 12 blocks = 6k tokens, sigma 1, at most 240 blocks). Hashes are
  chained, so the same document under two system prompts is two different block chains.
- conversation popularity is Zipf with s=1.0 by rank (agentic / chat traffic: a head of very hot
  shared contexts, a long tail; s~1 is what prefix-reuse studies of production traces report
  for shared-prefix popularity). Each instance holds the conversations it drew from that
  distribution, in draw order (re-drawn ones become most recent), until it holds 100 000
  distinct blocks; half of the draws hold the whole chain, half a random prefix of it (earlier
  turns, or a tail already evicted), so holders of one chain stop at many different depths.
  With 4096 instances this puts the hottest prefixes on every instance, and each of the ~5
  million universe blocks on ~10-4096 instances: a lookup for a hot prefix intersects thousands
  of holders over dozens of levels.
- requests are drawn from the same Zipf: a random prefix of a conversation's chain (a turn),
  plus 1-4 fresh blocks (the new user turn, never cached); 10 % are brand-new conversations
  (system prompt hit only) and 2 % prompts nobody holds.

Run: ``python -m bench.decision --instances 16,256,4096 --blocks-per-instance 100000``.
Targets (issue 4): p99 <= 1 ms at 4096 instances, <= 200 us at 256.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.policy import build_scheduler
from agents.policy.common.numeric import IntArray
from agents.policy.common.prefix_index import sorted_distinct
from agents.policy.types import BLOCK_TOKENS, BlocksChanged, ClusterView, Finished, RequestView
from schemas.events import Heartbeat
from streams.snapshot import SnapshotCache

PROFILE = "llama3-8b-h100"
MODEL = "llama3-8b"
HEARTBEAT_S = 0.25
REQUESTS_PER_INSTANCE_S = 4.0
COMPLETION_DELAY_S = 0.5
SYSTEM_PROMPTS = 32
DOCUMENTS = 5_000
ZIPF_S = 1.0
EVICTION_SAMPLE = 1024


def _mix(x: npt.NDArray[np.uint64]) -> IntArray:
    """splitmix64 finaliser: distinct inputs -> well spread 64-bit block hashes."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.view(np.int64)


def _zipf_cdf(n: int, s: float) -> npt.NDArray[np.float64]:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    cdf = np.cumsum(weights)
    out: npt.NDArray[np.float64] = cdf / cdf[-1]
    return out


@dataclass(slots=True)
class Universe:
    """All conversation chains, concatenated: chain c is ``blocks[start[c] : start[c] + length[c]]``."""

    blocks: IntArray
    start: IntArray
    length: IntArray
    system_length: IntArray  # blocks of chain c that are its system prompt
    cdf: npt.NDArray[np.float64]  # Zipf popularity over conversations

    def draw(self, rng: np.random.Generator, k: int) -> IntArray:
        return np.minimum(np.searchsorted(self.cdf, rng.random(k)), len(self.cdf) - 1).astype(np.int64)

    def prefixes(self, chains: IntArray, lengths: IntArray) -> IntArray:
        """The first ``lengths[j]`` blocks of each chain ``chains[j]``, concatenated."""
        total = int(lengths.sum())
        offsets = np.repeat(self.start[chains] - (np.cumsum(lengths) - lengths), lengths)
        return self.blocks[offsets + np.arange(total)]


def build_universe(conversations: int, rng: np.random.Generator) -> Universe:
    system_len = rng.integers(1, 9, SYSTEM_PROMPTS)
    doc_len = np.clip(np.round(rng.lognormal(np.log(8), 1.0, DOCUMENTS)), 1, 120).astype(np.int64)
    body_len = np.clip(np.round(rng.lognormal(np.log(12), 1.0, conversations)), 1, 240).astype(np.int64)
    system = np.searchsorted(_zipf_cdf(SYSTEM_PROMPTS, ZIPF_S), rng.random(conversations))
    system = np.minimum(system, SYSTEM_PROMPTS - 1)
    has_doc = rng.random(conversations) < 0.5
    doc = np.minimum(np.searchsorted(_zipf_cdf(DOCUMENTS, ZIPF_S), rng.random(conversations)), DOCUMENTS - 1)
    d_len = np.where(has_doc, doc_len[doc], 0)
    s_len = system_len[system]
    length = s_len + d_len + body_len
    start = np.cumsum(length) - length
    total = int(length.sum())
    chain = np.repeat(np.arange(conversations), length)
    pos = np.arange(total) - np.repeat(start, length)
    in_sys = pos < np.repeat(s_len, length)
    in_doc = ~in_sys & (pos < np.repeat(s_len + d_len, length))
    # Key of each block: what its chained hash depends on (system prompt; + document; + body).
    sys_key = system[chain].astype(np.uint64)
    doc_key = (doc[chain] + 1).astype(np.uint64)
    key = np.where(
        in_sys,
        (sys_key << np.uint64(8)) + pos.astype(np.uint64),
        np.where(
            in_doc,
            (np.uint64(1) << np.uint64(40)) + (sys_key << np.uint64(24)) + (doc_key << np.uint64(8)) + pos,
            (np.uint64(2) << np.uint64(40)) + (chain.astype(np.uint64) << np.uint64(8)) + pos,
        ),
    ).astype(np.uint64)
    return Universe(_mix(key), start, length, s_len, _zipf_cdf(conversations, ZIPF_S))


def instance_content(universe: Universe, blocks: int, rng: np.random.Generator) -> IntArray:
    """The ``blocks`` distinct block hashes an instance holds, least recent first (the last
    ones it touched, in order of its last touch)."""
    parts: list[IntArray] = []
    batch = max(64, blocks // 8)
    seen = np.zeros(0, dtype=np.int64)
    while True:
        chains = universe.draw(rng, batch)
        full = universe.length[chains]
        partial = rng.integers(1, full + 1)
        lengths = np.where(rng.random(batch) < 0.5, full, partial)
        parts.append(universe.prefixes(chains, lengths))
        seen = sorted_distinct(np.concatenate([seen, parts[-1]]))
        if len(seen) >= blocks:
            break
    touches = np.concatenate(parts)
    distinct = np.array(_oldest_distinct(touches, len(touches)), dtype=np.int64)
    return distinct[-blocks:]


class Requests:
    """Requests drawn from the cache's own popularity distribution."""

    def __init__(self, universe: Universe, rng: np.random.Generator) -> None:
        self.universe = universe
        self.rng = rng
        self.count = 0

    def next(self, now_s: float) -> RequestView:
        rng, u = self.rng, self.universe
        self.count += 1
        kind = rng.random()
        chain = int(u.draw(rng, 1)[0])
        if kind < 0.02:  # nobody holds it
            blocks = _mix(rng.integers(0, 2**62, int(rng.integers(1, 40)), dtype=np.int64).view(np.uint64))
        else:
            depth = (
                int(u.system_length[chain]) if kind < 0.12 else int(rng.integers(1, int(u.length[chain]) + 1))
            )
            cached = u.prefixes(np.array([chain]), np.array([depth]))
            fresh = _mix(rng.integers(0, 2**62, int(rng.integers(1, 5)), dtype=np.int64).view(np.uint64))
            blocks = np.concatenate([cached, fresh])
        hashes = tuple(blocks.tolist())
        return RequestView(
            request_id=f"r{self.count}",
            attempt=1,
            tenant="t",
            model=MODEL,
            slo_class="interactive",
            input_tokens=len(hashes) * BLOCK_TOKENS + int(rng.integers(0, BLOCK_TOKENS)),
            output_budget=int(rng.integers(64, 2048)),
            block_hashes=hashes,
            arrival_s=now_s,
        )


def heartbeats(ids: tuple[str, ...], blocks: int, now_s: float, rng: np.random.Generator) -> list[Heartbeat]:
    """One heartbeat round of the pool (random load, as a busy pool reports it)."""
    n = len(ids)
    running = rng.integers(0, 64, n).tolist()
    waiting = rng.integers(0, 4, n).tolist()
    tokens = (np.array(running) * rng.integers(1_000, 12_000, n)).tolist()
    used = rng.integers(blocks // 2, blocks, n).tolist()
    return [
        Heartbeat(
            ts=now_s, instance_id=iid, dc="dc-1", model=MODEL, model_version="1", profile=PROFILE,
            waiting=waiting[k], running=running[k], tokens_in_flight=tokens[k],
            kv_blocks_used=used[k], kv_blocks_total=blocks,
        )
        for k, iid in enumerate(ids)
    ]  # fmt: skip


class ViewSource:
    """The streaming path's view builder over a pool's heartbeats, with its costs recorded."""

    def __init__(self, beats: list[Heartbeat]) -> None:
        self.cache = SnapshotCache()
        for b in beats:
            self.cache.record(b)
        self.update_ns: list[int] = []
        self.rebuild_ns: list[int] = []
        self.cached_ns: list[int] = []
        self.table_build_ns = 0  # the first view: the pool's columns copied into a view
        self._fresh = False

    def beat(self, beats: list[Heartbeat]) -> None:
        for b in beats:
            t = time.perf_counter_ns()
            self.cache.record(b)
            self.update_ns.append(time.perf_counter_ns() - t)
        self._fresh = True

    def view(self, record: bool) -> ClusterView:
        t = time.perf_counter_ns()
        view = self.cache.view(MODEL)
        elapsed = time.perf_counter_ns() - t
        assert view is not None
        if not self.table_build_ns:
            self.table_build_ns = elapsed
        elif self._fresh:  # recorded in warm-up too: a large pool may beat only once per run
            self.rebuild_ns.append(elapsed)
        elif record:
            self.cached_ns.append(elapsed)
        self._fresh = False
        return view


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_pool(
    policy_name: str,
    instances: int,
    blocks: int,
    decisions: int,
    warmup: int,
    universe: Universe,
    seed: int,
    profile: int = 0,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed + instances)
    scheduler = build_scheduler(policy_name, seed=seed)
    router = scheduler.instance_selection
    index = getattr(router, "index", None) or getattr(router, "tree", None)
    if index is None:
        raise SystemExit(f"policy {policy_name!r} has no prefix index")
    ids = tuple(f"i{k:04d}" for k in range(instances))
    now = 0.0
    views = ViewSource(heartbeats(ids, blocks, now, rng))
    view = views.view(record=False)

    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    content_s = 0.0
    oldest: dict[str, IntArray] = {}
    group = 128
    for iid in ids:
        index.set_capacity(iid, blocks)
    for lo in range(0, instances, group):
        c0 = time.perf_counter()
        batch = {
            ids[k]: instance_content(universe, blocks, rng) for k in range(lo, min(instances, lo + group))
        }
        content_s += time.perf_counter() - c0
        index.add_many(batch)
        for iid, content in batch.items():  # its least recent blocks: what it evicts first
            oldest[iid] = content[:EVICTION_SAMPLE].copy()
        del batch
    build_s = time.perf_counter() - t0 - content_s
    gc.collect()
    index_bytes = rss_bytes() - rss0
    held = [index.blocks_held(i) for i in ids]

    source = Requests(universe, rng)
    dt = HEARTBEAT_S / (instances * REQUESTS_PER_INSTANCE_S * HEARTBEAT_S)
    per_heartbeat = max(1, round(instances * REQUESTS_PER_INSTANCE_S * HEARTBEAT_S))
    pending: deque[tuple[float, RequestView, str]] = deque()
    latencies: list[int] = []
    cpu_times: list[int] = []
    match_times: list[int] = []
    holders: list[int] = []
    updates: list[int] = []
    depths: list[int] = []
    evicted = {iid: 0 for iid in ids}
    gc.disable()
    for k in range(warmup + decisions):
        now += dt
        if k % per_heartbeat == 0:
            views.beat(heartbeats(ids, blocks, now, rng))
        view = views.view(record=k >= warmup)
        request = source.next(now)
        m0 = time.perf_counter_ns()
        matched = index.match_array(request.block_hashes, view)
        match_ns = time.perf_counter_ns() - m0
        if k >= warmup:
            depths.append(int(matched.max()))
            holders.append(int(np.count_nonzero(matched)))
            match_times.append(match_ns)
        c = time.thread_time_ns()
        t = time.perf_counter_ns()
        decision = scheduler.submit([request], view, now)[0]
        elapsed = time.perf_counter_ns() - t
        cpu = time.thread_time_ns() - c
        # What the router receives before the next decision (untimed above, timed here).
        u0 = time.perf_counter_ns()
        iid = decision.instance_id
        stored = request.block_hashes
        scheduler.observe(BlocksChanged(iid, "stored", stored, now))
        # The instance evicts as many of its least recent blocks.
        start = evicted[iid]
        victims = tuple(oldest[iid][start : start + len(stored)].tolist())
        evicted[iid] = start + len(stored)
        scheduler.observe(BlocksChanged(iid, "removed", victims, now))
        pending.append((now + COMPLETION_DELAY_S, request, iid))
        while pending and pending[0][0] <= now:
            _, done, where = pending.popleft()
            ttft = 0.05 + 1e-5 * done.input_tokens * float(rng.random())
            scheduler.observe(
                Finished(done.request_id, 1, where, "ok", done.input_tokens, 0, 64, ttft, 0.01, now)
            )
        update = time.perf_counter_ns() - u0
        if k >= warmup:
            latencies.append(elapsed)
            cpu_times.append(cpu)
            updates.append(update)
    gc.enable()
    if profile:  # extra decisions under cProfile, after the timed ones (it slows them down)
        profiler = cProfile.Profile()
        for _ in range(profile):
            now += dt
            request = source.next(now)
            profiler.enable()
            decision = scheduler.submit([request], view, now)[0]
            profiler.disable()
            scheduler.observe(BlocksChanged(decision.instance_id, "stored", request.block_hashes, now))
        print(f"--- profile of {profile} decisions at {instances} instances (by own time) ---")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    lat = np.array(latencies, dtype=np.float64) / 1e3
    upd = np.array(updates, dtype=np.float64) / 1e3
    cpu_us = np.array(cpu_times, dtype=np.float64) / 1e3
    match_us = np.array(match_times, dtype=np.float64) / 1e3
    cached_view_us = np.array(views.cached_ns, dtype=np.float64) / 1e3
    rebuild_us = np.array(views.rebuild_ns or [0], dtype=np.float64) / 1e3
    return {
        "policy": policy_name,
        "instances": instances,
        "blocks_per_instance": blocks,
        "blocks_held_min": min(held),
        "memberships": sum(held),
        "decisions": decisions,
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
        "max_us": float(lat.max()),
        "decisions_per_s": float(1e6 / lat.mean()),
        "cpu_p50_us": float(np.percentile(cpu_us, 50)),
        "cpu_p99_us": float(np.percentile(cpu_us, 99)),
        "update_p50_us": float(np.percentile(upd, 50)),
        "update_p99_us": float(np.percentile(upd, 99)),
        "match_p50_us": float(np.percentile(match_us, 50)),
        "match_p99_us": float(np.percentile(match_us, 99)),
        "view_p50_us": float(np.percentile(cached_view_us, 50)),
        "view_p99_us": float(np.percentile(cached_view_us, 99)),
        "view_rebuild_p50_us": float(np.percentile(rebuild_us, 50)),
        "first_view_ms": views.table_build_ns / 1e6,
        "heartbeat_update_p50_us": float(np.percentile(np.array(views.update_ns) / 1e3, 50)),
        "median_holders_matched": float(statistics.median(holders)),
        "hit_share": float(np.mean(np.array(depths) > 0)),
        "median_match_depth": float(statistics.median(depths)),
        "build_s": build_s,
        "content_generation_s": content_s,
        "index_rss_mib": index_bytes / 2**20,
        "peak_rss_mib": peak_rss_bytes() / 2**20,
    }


def _oldest_distinct(content: IntArray, count: int) -> list[int]:
    """The ``count`` least recent distinct blocks of a touch sequence (least recent first)."""
    reverse = content[::-1]
    _, first = np.unique(reverse, return_index=True)
    last = np.sort(len(content) - 1 - first)  # last occurrence of each block, in order
    out: list[int] = content[last[:count]].tolist()
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", default="16,256,4096", help="comma-separated pool sizes")
    parser.add_argument("--blocks-per-instance", type=int, default=100_000)
    parser.add_argument("--decisions", type=int, default=2000, help="timed decisions per pool")
    parser.add_argument("--warmup", type=int, default=200, help="untimed decisions first")
    parser.add_argument("--conversations", type=int, default=200_000, help="universe size")
    parser.add_argument("--policy", default="tokenpilot")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0, help="then N decisions under cProfile")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    universe = build_universe(args.conversations, rng)
    print(
        f"universe: {args.conversations:,} conversations, {len(universe.blocks):,} chain blocks "
        f"({len(sorted_distinct(universe.blocks)):,} distinct) in {time.perf_counter() - t0:.1f} s; "
        f"policy {args.policy}"
    )
    header = (
        f"{'instances':>9} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'dec/s':>8} {'upd p50':>8} "
        f"{'upd p99':>8} {'cpu p99':>8} {'idx p50':>8} {'idx p99':>8} {'hit':>5} {'depth':>6} {'holders':>7} "
        f"{'build s':>8} {'index MiB':>10} {'peak MiB':>9} {'view p50':>8} {'view p99':>8} "
        f"{'rebuild':>8} {'beat us':>7} {'first ms':>8}"
    )
    print(header)
    results = []
    for n in (int(x) for x in args.instances.split(",")):
        r = run_pool(
            args.policy,
            n,
            args.blocks_per_instance,
            args.decisions,
            args.warmup,
            universe,
            args.seed,
            args.profile,
        )
        results.append(r)
        print(
            f"{n:>9} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['max_us']:>8.0f} "
            f"{r['decisions_per_s']:>8,.0f} {r['update_p50_us']:>8.0f} {r['update_p99_us']:>8.0f} "
            f"{r['cpu_p99_us']:>8.0f} {r['match_p50_us']:>8.0f} {r['match_p99_us']:>8.0f} "
            f"{r['hit_share']:>5.0%} {r['median_match_depth']:>6.0f} "
            f"{r['median_holders_matched']:>7.0f} {r['build_s']:>8.1f} "
            f"{r['index_rss_mib']:>10,.0f} {r['peak_rss_mib']:>9,.0f} {r['view_p50_us']:>8.1f} "
            f"{r['view_p99_us']:>8.1f} {r['view_rebuild_p50_us']:>8.0f} {r['heartbeat_update_p50_us']:>7.1f} "
            f"{r['first_view_ms']:>8.1f}",
            flush=True,
        )
        gc.collect()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
