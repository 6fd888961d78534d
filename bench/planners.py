"""Benchmark: the planners on a multi-model day (``python -m bench.planners``).

``python -m bench.planners [--days tuning,seed1,...] [--budgets ample,tight] [--out DIR]
[--jobs N]``

Each cell is one ``tokenfleet simulate --fleet F --workload W --policy fleetmind+tokenpilot
--planner static --planner hpa --planner dynamo-sla --planner fleetmind`` (``--rate-scale 1.5``
with the tight budget), each planner's run written to ``DIR/DAY-BUDGET@PLANNER.json`` (a run
whose file exists is read, not run again: a planner's runs do not depend on the others'). The
fleets are ``sim/scenarios/model-day/ample.yaml`` (the static fleet sized for each model's own
peak; GPU budgets far above it) and ``tight.yaml`` (each DC holds
exactly the static fleet's GPUs); ``slow`` doubles every load time of the ample fleet.

The days (``DAYS``): the tuning day, and the held-out ones: other seeds, other phase offsets
between the models, load times twice as long, and a day with no daily swing. Printed per cell
and planner: cost per million compliant tokens, goodput, each class's compliant share, GPU-hours,
starts (cold / warm) and requests lost in scale-down; then the targets:

- ample: fleetmind's cost <= 0.70 x static's and <= 0.85 x the better of hpa and dynamo-sla's,
  every class's compliant share >= static's - 0.01, nothing lost in scale-down;
- tight (1.5 x the load): fleetmind's goodput >= 1.15 x static's and >= 1.05 x the better peer's.

With an ample budget a last line gives the reference of a planner that knows the future
(``oracle_gpu_hours``): what FleetMind's cost could at best come down to on that day.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.engine.fleet import fleet_from_doc
from sim.evaluation.compare import compare
from sim.loop.config import SimConfig
from sim.workloads.sources import open_workload

POLICY = "fleetmind+tokenpilot"
PLANNERS = ("static", "hpa", "dynamo-sla", "fleetmind")
FLEETS = Path(__file__).resolve().parents[1] / "sim" / "scenarios" / "model-day"
BASE = (
    "synthetic:duration_s=7200,rate_per_s=28,tenants=12,models=llama3-8b+qwen3-14b+llama3-70b,"
    "model_shares=0.5+0.3+0.2,day_s=7200"
)
DAYS = {
    "tuning": f"{BASE},swing=0.8,seed=0",
    "seed1": f"{BASE},swing=0.8,seed=1",
    "seed2": f"{BASE},swing=0.8,seed=2",
    "phases": f"{BASE},swing=0.8,phases=0.8+0.15+0.45,seed=3",
    "together": f"{BASE},swing=0.8,phases=0.4+0.5+0.6,seed=5",
    "flat": f"{BASE},swing=0,seed=4",
}
BUDGETS = {
    "ample": ("ample.yaml", 1.0, 1.0),
    "tight": ("tight.yaml", 1.5, 1.0),
    "slow": ("ample.yaml", 1.0, 2.0),
}
"""Budget -> (fleet file, rate scale, load-time factor)."""


@dataclass(frozen=True, slots=True)
class Cell:
    day: str
    budget: str

    @property
    def name(self) -> str:
        return f"{self.day}-{self.budget}"


def fleet_for(budget: str) -> Any:
    """The budget's fleet, its load times scaled by the budget's factor."""
    file, _, factor = BUDGETS[budget]
    doc = yaml.safe_load((FLEETS / file).read_text())
    for entry in doc.get("models", {}).values():
        entry["load_s"] = {k: v * factor for k, v in entry["load_s"].items()}
    return fleet_from_doc(doc, Path(f"{budget}.yaml"))


def run(cell: Cell, planner: str, out: Path) -> dict[str, Any]:
    """One planner's simulate document of a cell (read back if ``out`` has it: a planner
    changed since is run again by deleting its files, ``DIR/DAY-BUDGET@PLANNER.json``)."""
    path = out / f"{cell.name}@{planner}.json"
    if path.exists():
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    _, scale, _ = BUDGETS[cell.budget]
    workload = open_workload(DAYS[cell.day])
    fleet = fleet_for(cell.budget)
    document, _ = compare(workload, fleet, [POLICY], SimConfig(), scale, None, None, [planner])
    results = document["results"]
    assert isinstance(results, dict)
    document["results"] = {f"{POLICY}@{planner}": results[POLICY]}
    path.write_text(json.dumps(document, indent=1))
    return document


def rows(cell: Cell, document: dict[str, Any]) -> list[str]:
    """The cell's lines: a row per planner, then its targets."""
    results = {key.split("@")[1]: r for key, r in document["results"].items()}
    classes = sorted(results["static"]["per_class"])
    lines = [f"\n{cell.name}: {document['requests']} requests, rate x{document['rate_scale']}"]
    head = ["planner", "$/Mgood", "goodput", *classes, "GPU-h", "starts c/w", "lost"]
    lines.append("  ".join(f"{h:>12}" for h in head))
    for planner, r in results.items():
        shares = [f"{r['per_class'][c]['compliant_share']:.4f}" for c in classes]
        cells = [
            planner,
            f"{r['cost_per_million_goodput_tokens']:.3f}",
            f"{r['goodput_tokens_per_s']:.0f}",
            *shares,
        ]
        cells += [
            f"{r['gpu_hours']:.1f}",
            f"{r['cold_starts']}/{r['warm_starts']}",
            str(r["lost_in_scale_down"]),
        ]
        lines.append("  ".join(f"{c:>12}" for c in cells))
    lines.append("  " + verdict(cell, results, classes))
    if cell.budget != "tight":
        bound = oracle_gpu_hours(results["static"], fleet_for(cell.budget))
        lines.append(
            f"  bound: a planner that knows each model's demand {ORACLE_LOOKAHEAD_MIN} minutes ahead "
            f"holds {bound:.1f} GPU-h, {bound / results['static']['gpu_hours']:.3f}x static's"
        )
    return lines


ORACLE_LOOKAHEAD_MIN = 5
ORACLE_FLOOR = 2
"""The bound's replicas per model at least: one, and one in another failure domain."""


def oracle_gpu_hours(static: dict[str, Any], fleet: Any) -> float:
    """GPU-hours of a planner that loads instantly and knows the future: each minute, per model
    m, max(``ORACLE_FLOOR``, ceil(d / c_m)) replicas, d the most arrivals per second of m's
    minutes from this one to ``ORACLE_LOOKAHEAD_MIN`` - 1 later, c_m what one replica of the
    static fleet serves at m's busiest minute (its peak rate / its replicas: the static fleet is
    sized for each model's own peak), from the static run's timeline."""
    listed = Counter(spec.model for spec in fleet.instances)
    gpus = {spec.model: spec.profile.gpus for spec in fleet.instances}
    total = 0.0
    timeline = static["timeline"]
    step_h = (timeline["t_s"][1] - timeline["t_s"][0]) / 3600
    for model, rates in timeline["demand_per_s"].items():
        per_replica = max(rates) / listed[model]
        for k in range(len(rates)):
            ahead = max(rates[k : k + ORACLE_LOOKAHEAD_MIN])
            total += max(ORACLE_FLOOR, math.ceil(ahead / per_replica - 1e-9)) * gpus[model] * step_h
    return total


def verdict(cell: Cell, results: dict[str, Any], classes: list[str]) -> str:
    """The targets of the module docstring, each with its ratio."""
    fm, static = results["fleetmind"], results["static"]
    peers = [results["hpa"], results["dynamo-sla"]]
    if cell.budget == "tight":
        g = fm["goodput_tokens_per_s"]
        best = max(p["goodput_tokens_per_s"] for p in peers)
        return (
            f"goodput {g / static['goodput_tokens_per_s']:.3f}x static (>= 1.15), "
            f"{g / best:.3f}x the better peer (>= 1.05)"
        )
    cost = fm["cost_per_million_goodput_tokens"]
    best = min(p["cost_per_million_goodput_tokens"] for p in peers)
    worst = min(
        fm["per_class"][c]["compliant_share"] - static["per_class"][c]["compliant_share"] for c in classes
    )
    return (
        f"cost {cost / static['cost_per_million_goodput_tokens']:.3f}x static (<= 0.70), {cost / best:.3f}x "
        f"the better peer (<= 0.85); compliant share vs static, worst class {worst:+.4f} (>= -0.01); "
        f"lost {fm['lost_in_scale_down']}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", default=",".join(DAYS), help=f"of {', '.join(DAYS)}")
    parser.add_argument("--budgets", default="ample,tight", help=f"of {', '.join(BUDGETS)}")
    parser.add_argument("--out", type=Path, default=Path("out/planners"))
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cells = [Cell(d, b) for b in args.budgets.split(",") for d in args.days.split(",")]
    jobs = [(cell, planner) for cell in cells for planner in PLANNERS]
    with ProcessPoolExecutor(args.jobs) as pool:
        documents = list(pool.map(run, *zip(*jobs, strict=True), [args.out] * len(jobs)))
    for k, cell in enumerate(cells):
        parts = documents[k * len(PLANNERS) : (k + 1) * len(PLANNERS)]
        merged = {**parts[0], "results": {key: r for d in parts for key, r in d["results"].items()}}
        print("\n".join(rows(cell, merged)))


if __name__ == "__main__":
    main()
