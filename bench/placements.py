"""Benchmark: what another decider's placement costs a decider, in one process, without Kafka.

``python -m bench.placements [--requests N] [--batch 8] [--log-delay-ms 2] [--policy tokenpilot]
[--repeat 3]``

Two ``RoutingService``s (deciders ``a`` and ``b`` of one pool, the worker's own service) on
``bench.stream``'s fleet (8 idle instances) and requests (~8k prompt tokens, shared prefixes).
They decide the requests in turn, a batch each (``--batch`` requests arriving together), and
before each of its batches a decider applies the other's placements made at least
``--log-delay-ms`` earlier, decoded from the wire bytes as the worker decodes ``tf.decisions``
(``RoutingDecision`` -> ``RoutingService.observe_placement``), then offers what it deferred
that is due (``tick`` at ``next_wake``, as the worker's timer does: once a decider has read
the other's placements it decides in lane 0 or 1 of 2 and defers arrivals a few log delays,
``Scheduler.submit``). At the end both offer what they still hold until nothing is. Printed per
repeat, then the medians: CPU µs per request decided (``route`` and ``tick``, per request
placed) and per placement applied. Their ratio is what a second decider adds to a pool's CPU
per request before Kafka's own costs (``bench.stream_pair`` measures the whole pair, Kafka
included).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import NamedTuple

from agents.routing import RoutingService
from bench.stream_run import RequestFactory, idle_instances
from schemas.events import InferenceRequest, RoutingDecision
from streams.snapshot import SnapshotCache


class Costs(NamedTuple):
    route_us: float  # CPU per request decided
    apply_us: float  # CPU per placement of the other decider applied
    placed: int  # requests placed by either decider
    applied: int  # placements applied by the decider that did not make them


def measure(requests: int, batch: int, log_delay_s: float, policy: str, seed: int) -> Costs:
    """What deciding ``requests`` between two deciders cost (``Costs``)."""
    cache = SnapshotCache()
    start = time.time()
    for beat in idle_instances():
        cache.record(beat.model_copy(update={"ts": start}))
    pool = idle_instances()[0].model
    factory = RequestFactory(seed=seed)
    deciders = [
        RoutingService(policy, seed=seed, worker=name, log_delay_s=log_delay_s) for name in ("a:1", "b:1")
    ]
    for decider in deciders:  # (first decisions: compiled kernels loaded, arrays sized)
        decider.route(pool, [factory.request(f"warm-{decider.worker}")], cache.view(pool), start)
    unread: list[list[tuple[float, bytes]]] = [[], []]  # per decider: (readable at, record)
    route_s = apply_s = 0.0
    applied = placed = 0

    def decide(k: int, arrivals: list[InferenceRequest], now: float) -> None:
        """Decider ``k``'s due deferred requests, then ``arrivals``; its placements go on the log."""
        nonlocal route_s, placed
        decider, view = deciders[k], cache.view(pool)
        assert view is not None  # (every instance reported above)
        began = time.process_time()
        wake = decider.next_wake(pool)
        routed = decider.tick(pool, view, now) if wake is not None and wake <= now else []
        if arrivals:
            routed += decider.route(pool, arrivals, view, now)
        route_s += time.process_time() - began
        decisions = [r.routing for r in routed if r.routing]
        placed += len(decisions)
        unread[1 - k] += [(d.ts + log_delay_s, d.model_dump_json().encode()) for d in decisions]

    def apply(k: int, now: float) -> None:
        """Decider ``k`` reads the other's placements that are due by ``now``."""
        nonlocal apply_s, applied
        due = [raw for at, raw in unread[k] if at <= now]
        unread[k] = [(at, raw) for at, raw in unread[k] if at > now]
        began = time.process_time()
        for raw in due:
            deciders[k].observe_placement(RoutingDecision.model_validate_json(raw))
        apply_s += time.process_time() - began
        applied += len(due)

    for first in range(0, requests, batch):
        now = time.time()
        k = (first // batch) % 2
        apply(k, now)
        arrivals = [
            factory.request(f"r-{i}").model_copy(update={"ts": now})
            for i in range(first, min(first + batch, requests))
        ]
        decide(k, arrivals, now)
    while any(d.held(pool) for d in deciders) or any(unread):  # what is still deferred or unread
        time.sleep(log_delay_s / 2 + 0.001)
        for k in (0, 1):
            apply(k, time.time())
            decide(k, [], time.time())
    return Costs(1e6 * route_s / max(placed, 1), 1e6 * apply_s / max(applied, 1), placed, applied)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placements", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=8, help="requests decided together")
    parser.add_argument("--log-delay-ms", type=float, default=2.0, help="how late a placement is read")
    parser.add_argument("--policy", default="tokenpilot")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.requests, args.batch, args.repeat) < 1 or args.log_delay_ms < 0:
        parser.error("--requests, --batch and --repeat take positive numbers, --log-delay-ms one >= 0")
    runs = []
    for index in range(args.repeat):
        delay_s = args.log_delay_ms / 1000
        route_us, apply_us, _, _ = measure(args.requests, args.batch, delay_s, args.policy, args.seed)
        runs.append((route_us, apply_us))
        print(f"run {index}: {route_us:.1f} µs per request decided, {apply_us:.1f} µs per placement applied")
    route_us = statistics.median(r for r, _ in runs)
    apply_us = statistics.median(a for _, a in runs)
    print(
        f"median of {args.repeat} ({args.policy}): {route_us:.1f} µs per request decided,"
        f" {apply_us:.1f} µs per other decider's placement applied ({apply_us / route_us:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
