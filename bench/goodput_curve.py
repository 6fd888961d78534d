"""Benchmark: goodput against load, what admission buys and what it costs (``make goodput``).

``python -m bench.goodput_curve [--workload NAME=SPEC] [--loads 0.25,0.5,...] [--jobs N] [--json OUT]``

Each workload has its L67: the rate scale at which ``tokenpilot`` with no admission keeps a
compliant share of about 67 % (``python -m bench.slomax`` finds it by bisection; the values
below are what it found, the command beside each). At every load (a multiple of L67) one
seeded comparison (``sim.evaluation.compare``: same fleet, clients with timeouts and retries,
seed) of ``round-robin``, ``tokenpilot``, ``slomax+tokenpilot`` and ``slomax+least-tokens``.
Printed per workload and load: each policy's goodput, compliant share, cost per million
compliant tokens (``sim/evaluation/cost.py``), rejects and
``rejected_met_without_admission`` (``sim/evaluation/regret.py``: rejected requests its twin
without admission served within their objective), and ``slomax+tokenpilot``'s goodput per class
as a ratio to ``tokenpilot``'s. ``tokenfleet report OUT`` draws the curve (goodput and compliant
share against load, one line per policy, one row of panels per workload).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, cast

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from sim.engine.fleet import parse_fleet
from sim.evaluation.compare import compare
from sim.loop.config import SimConfig
from sim.workloads.sources import open_workload

POLICIES = ("round-robin", "tokenpilot", "slomax+tokenpilot", "slomax+least-tokens")
LOADS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
WORKLOADS = {
    # name: (workload spec, its L67 rate scale, the L67 scan that found it:
    # python -m bench.slomax --workload SPEC --low A --high B)
    "synthetic": ("synthetic:rate_per_s=10,duration_s=2400,batch_jobs_per_hour=40", 4.172, (2.5, 4.5)),
    "mooncake": ("sim/traces/mooncake/conversation_trace.jsonl", 6.75, (2.0, 10.0)),
    "azure-code": ("sim/traces/azure/AzureLLMInferenceTrace_code.csv", 30.0, (20.0, 60.0)),
}
FLEET = "8xllama3-8b-h100"
_KEPT = ("goodput_tokens_per_s", "compliant_share", "output_tokens_per_s", "requests", "rejected",
         "rejected_met_without_admission", "cost_per_million_goodput_tokens",
         "wasted_gpu_seconds")  # fmt: skip


def point(spec: str, rate_scale: float, seed: int) -> dict[str, Any]:
    """One comparison at ``rate_scale``: per policy the ``_KEPT`` figures, in total and per class."""
    workload = open_workload(spec, seed=seed)
    config = SimConfig(seed=seed, slo_classes=dict(DEFAULT_SLO_CLASSES))
    document, _ = compare(workload, parse_fleet(FLEET), POLICIES, config, rate_scale)
    results = cast(dict[str, dict[str, Any]], document["results"])
    return {
        name: {
            **{k: result.get(k) for k in _KEPT},
            "per_class": {c: {k: m.get(k) for k in _KEPT} for c, m in result["per_class"].items()},
        }
        for name, result in results.items()
    }


def _ratio(mine: float | None, theirs: float | None) -> str:
    if not theirs:
        return "-"
    return f"{(mine or 0.0) / theirs:.3f}"


def _dollars(figures: dict[str, Any]) -> str:
    cost = figures.get("cost_per_million_goodput_tokens")
    return "-" if cost is None else f"{cost:.2f}"


def table(name: str, l67: float, points: Sequence[dict[str, Any]]) -> str:
    lines = [f"{name} (L67 = rate scale {l67:g}):"]
    head = (
        "load",
        "policy",
        "goodput",
        "compliant",
        "$/M good",
        "rejected",
        "regret",
        "vs tokenpilot per class",
    )
    rows: list[tuple[str, ...]] = [head]
    for p in points:
        fcfs = p["policies"]["tokenpilot"]
        for policy, f in p["policies"].items():
            ratios = ""
            if policy == "slomax+tokenpilot":
                ratios = ", ".join(
                    f"{c} {_ratio(m['goodput_tokens_per_s'], fcfs['per_class'][c]['goodput_tokens_per_s'])}"
                    for c, m in f["per_class"].items()
                )
            regret = f.get("rejected_met_without_admission")
            rows.append((
                f"{p['load']:g} x L67" if policy == POLICIES[0] else "", policy,
                f"{f['goodput_tokens_per_s']:,.0f}", f"{f['compliant_share']:.3f}", _dollars(f),
                str(f["rejected"]),
                "-" if regret is None else str(regret), ratios,
            ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.goodput_curve", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload",
        action="append",
        metavar="NAME[=SPEC@L67]",
        help=f"a workload of {', '.join(WORKLOADS)} or NAME=SPEC@L67 (repeat; default: all three)",
    )
    parser.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS), help="multiples of L67")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="comparisons run in parallel")
    parser.add_argument("--json", type=Path, help="write the figures here (tokenfleet report draws it)")
    args = parser.parse_args(argv)
    chosen: dict[str, tuple[str, float]] = {}
    for item in args.workload or list(WORKLOADS):
        if "=" in item:
            name, rest = item.split("=", 1)
            spec, _, l67 = rest.rpartition("@")
            if not spec:
                parser.error(f"--workload {item}: give NAME=SPEC@L67")
            chosen[name] = (spec, float(l67))
        elif item in WORKLOADS:
            chosen[item] = WORKLOADS[item][:2]
        else:
            parser.error(f"--workload {item}: not one of {', '.join(WORKLOADS)} and not NAME=SPEC@L67")
    loads = [float(x) for x in args.loads.split(",")]
    jobs = [(name, spec, l67, load) for name, (spec, l67) in chosen.items() for load in loads]
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = [pool.submit(point, spec, load * l67, args.seed) for _, spec, l67, load in jobs]
        figures = [f.result() for f in futures]
    curve: dict[str, Any] = {}
    for (name, spec, l67, load), policies in zip(jobs, figures, strict=True):
        entry = curve.setdefault(name, {"workload": spec, "l67": l67, "points": []})
        entry["points"].append({"load": load, "rate_scale": round(load * l67, 4), "policies": policies})
    for name, entry in curve.items():
        print(table(name, entry["l67"], entry["points"]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"fleet": FLEET, "seed": args.seed, "curve": curve}
        args.json.write_text(json.dumps(document, indent=1, default=_finite) + "\n")
        print(f"wrote {args.json}")
    return 0


def _finite(value: object) -> object:
    return None if isinstance(value, float) and math.isinf(value) else value


if __name__ == "__main__":
    raise SystemExit(main())
