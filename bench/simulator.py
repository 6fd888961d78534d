"""Benchmark: simulated requests per wall-clock second (``make bench``).

Runs the whole Mooncake conversation trace (12 031 requests) on 8 llama3-8b-h100 instances
with four policies, one after the other in one process, and prints per-policy wall time,
simulated requests per second, and the total (target: under 60 s on a 2-core machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

from sim.engine.fleet import parse_fleet
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads import MOONCAKE
from sim.workloads.trace import load_workload

TRACE = MOONCAKE
POLICIES = ("round-robin", "least-tokens", "sglang-cache-aware", "dynamo-kv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fleet", default="8xllama3-8b-h100")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per policy (median reported)")
    args = parser.parse_args()

    started = time.perf_counter()
    workload = load_workload(TRACE).scaled(args.rate_scale)
    load_s = time.perf_counter() - started
    fleet = parse_fleet(args.fleet)
    print(f"trace: {len(workload.requests)} requests loaded in {load_s:.2f} s; fleet {args.fleet}")
    print(f"{'policy':<20}{'median wall s':>14}{'requests/s':>12}{'attempts':>10}")
    total = load_s
    for name in POLICIES:
        walls = []
        attempts = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = simulate(workload, fleet, name, SimConfig(seed=0))
            walls.append(time.perf_counter() - t0)
            attempts = len(result.attempts)
        wall = statistics.median(walls)
        total += sum(walls)
        print(f"{name:<20}{wall:>14.2f}{len(workload.requests) / wall:>12,.0f}{attempts:>10}")
    print(f"whole trace x {len(POLICIES)} policies: {total:.1f} s wall (target < 60 s)")


if __name__ == "__main__":
    main()
