"""Benchmark: SLO capacity with several deciders per pool against one (``make bench-deciders``).

``python -m bench.deciders [--held-out] [--deciders 2,4] [--splits affinity,random] [--jobs N]
[--json OUT]``

For each workload (Mooncake's conversation trace as shipped and with arrivals spread by 3 s,
the synthetic mix of 30 minutes; with ``--held-out`` the workloads the several-decider rules
were not tuned on: Mooncake spread by 1 s, both Azure traces, synthetic mixes with sharp bursts
and with slow waves; the default fleet and engine, ``--seed``) and each policy
(``tokenpilot``, ``slomax+tokenpilot``): the SLO capacity (``sim/evaluation/capacity.py``, to
``--precision``) of one decider, and of N deciders per pool for each N and split
(``sim/loop/deciders.py``; the others' placements read ``--decision-log-delay`` late). Printed:
each capacity and its ratio to one decider's (the target for the affinity split: >= 0.97).
Every cell is one bisection, run in parallel over ``--jobs`` processes; the same command,
cell for cell, is ``tokenfleet capacity --workload W [--jitter-arrivals 3] --policy P
--precision 0.01 --start S --deciders N --decider-split SPLIT``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from sim.engine.fleet import parse_fleet
from sim.evaluation.capacity import capacities
from sim.loop.config import SimConfig
from sim.loop.deciders import DECISION_LOG_DELAY_S, SPLITS, DeciderSplit
from sim.workloads.sources import open_workload

FLEET = "8xllama3-8b-h100"
POLICIES = ("tokenpilot", "slomax+tokenpilot")
TARGET = 0.97


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload of the table: its spec, the spread of its arrivals and the search's start."""

    label: str
    spec: str
    jitter_s: float
    start: float


WORKLOADS = (
    Workload("Mooncake as shipped", "sim/traces/mooncake/conversation_trace.jsonl", 0.0, 2.0),
    Workload("Mooncake, arrivals spread 3 s", "sim/traces/mooncake/conversation_trace.jsonl", 3.0, 2.4),
    Workload("synthetic mix", "synthetic:duration_s=1800", 0.0, 3.0),
)
HELD_OUT = (
    Workload("Mooncake, arrivals spread 1 s", "sim/traces/mooncake/conversation_trace.jsonl", 1.0, 2.2),
    Workload("Azure code", "sim/traces/azure/AzureLLMInferenceTrace_code.csv", 0.0, 3.0),
    Workload("Azure conversation", "sim/traces/azure/AzureLLMInferenceTrace_conv.csv", 0.0, 3.0),
    Workload("synthetic, sharp bursts", "synthetic:duration_s=1800,burst_factor=6,mean_phase_s=20", 0.0, 2.0),
    Workload(
        "synthetic, slow waves", "synthetic:duration_s=1800,burst_factor=1.5,mean_phase_s=300", 0.0, 3.0
    ),
)
"""Workloads the several-decider rules were not tuned on (judged with other seeds too)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One capacity search: a workload, a policy, N deciders and their split."""

    workload: Workload
    policy: str
    deciders: int
    split: str


def search(cell: Cell, precision: float, log_delay_s: float, seed: int) -> float | None:
    """The cell's SLO capacity (rate scale), or None if even the smallest scale misses."""
    workload = open_workload(cell.workload.spec, seed=seed).jittered(cell.workload.jitter_s, seed)
    config = replace(
        SimConfig(seed=seed),
        deciders=cell.deciders,
        decision_log_delay_s=log_delay_s,
        decider_split=cast("DeciderSplit", cell.split),  # (checked by SimConfig)
    )
    document = capacities(workload, parse_fleet(FLEET), [cell.policy], config, cell.workload.start, precision)
    found = document["capacity"][cell.policy]["rate_scale"]  # type: ignore[index]
    return None if found is None else float(found)


def _search(args: tuple[Cell, float, float, int]) -> float | None:
    return search(*args)


def table(cells: Sequence[Cell], found: Sequence[float | None]) -> str:
    """Per workload and policy, each capacity and its ratio to one decider's."""
    by_cell = dict(zip(cells, found, strict=True))
    lines = [f"{'workload':<30} {'policy':<18} {'deciders':<14} {'capacity':>8} {'vs one':>7}"]
    for cell in cells:
        one = by_cell[Cell(cell.workload, cell.policy, 1, "affinity")]
        mine = by_cell[cell]
        ratio = "-" if cell.deciders == 1 or one is None or mine is None else f"{mine / one:.3f}"
        name = "1" if cell.deciders == 1 else f"{cell.deciders} {cell.split}"
        value = "-" if mine is None else f"{mine:.3f}"
        lines.append(f"{cell.workload.label:<30} {cell.policy:<18} {name:<14} {value:>8} {ratio:>7}")
    return "\n".join(lines)


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deciders", description=__doc__.splitlines()[0])
    parser.add_argument("--deciders", type=_numbers, default=[2, 4], help="deciders per pool (e.g. 2,4)")
    parser.add_argument("--splits", default="affinity,random", help=f"splits among {', '.join(SPLITS)}")
    parser.add_argument("--policy", action="append", help="policies (default: tokenpilot, slomax+tokenpilot)")
    parser.add_argument(
        "--workload", action="append", choices=[w.label for w in WORKLOADS + HELD_OUT], help="workloads"
    )
    parser.add_argument("--held-out", action="store_true", help="the held-out workloads instead")
    parser.add_argument("--precision", type=float, default=0.01)
    parser.add_argument("--decision-log-delay", type=float, default=DECISION_LOG_DELAY_S)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every capacity here")
    args = parser.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    if unknown := set(splits) - set(SPLITS):
        parser.error(f"unknown split(s) {', '.join(sorted(unknown))}; known: {', '.join(SPLITS)}")
    if any(n < 2 for n in args.deciders):
        parser.error("--deciders lists counts of at least 2 (one decider is always measured)")
    listed = HELD_OUT if args.held_out else WORKLOADS
    workloads = [w for w in WORKLOADS + HELD_OUT if w.label in args.workload] if args.workload else listed
    cells = [
        Cell(workload, policy, n, split)
        for workload in workloads
        for policy in args.policy or POLICIES
        for n, split in [(1, "affinity"), *[(n, s) for n in args.deciders for s in splits]]
    ]
    tasks = [(cell, args.precision, args.decision_log_delay, args.seed) for cell in cells]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        found = list(pool.map(_search, tasks))
    print(table(cells, found))
    if args.json:
        rows: list[dict[str, Any]] = [
            {
                "workload": c.workload.label,
                "policy": c.policy,
                "deciders": c.deciders,
                "split": c.split,
                "rate_scale": f,
            }
            for c, f in zip(cells, found, strict=True)
        ]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"decision_log_delay_s": args.decision_log_delay, "cells": rows}
        args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
