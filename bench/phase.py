"""Benchmark: how much of TokenPilot's TTFT prediction error is the phase of the engine step.

Most requests of a busy pool first wait for the engine step in progress to end. TokenPilot's
step clock (``agents/policy/tokenpilot/stepclock.py``) infers that wait from the step
boundaries a router sees (first tokens, ends of responses). This runs TokenPilot three times per
scoreboard cell, at its SLO capacity there (``make scoreboard``; ``--rate-scale`` for another
load), and prints its TTFT prediction MAPE (after warm-up, as the scoreboard reports it), that
MAPE over the exact-phase oracle's (``clock/exact``: how far TokenPilot is from the floor phase
knowledge allows) and its interactive SLO share (what the capacity search judges by):

- ``clock``: as shipped;
- ``stream``: the wait extrapolated from every step boundary, each seen ``--delay`` late (what
  a router reading every streamed token of every instance could know): the last step seen, of
  the engine's true length, if it ended at most two steps ago, else the clock's answer;
- ``exact``: the engine's true remaining step time (an oracle no router has: the bound of what
  phase knowledge can do; what is left is the engine's step noise and the law it departs from).

Each run makes its own decisions (a better wait changes placements too), so the three runs
differ in more than the prediction. Run: ``python -m bench.phase [--only CELL ...]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from agents.policy.common.numeric import FloatArray, IntArray
from agents.policy.pipeline import Scheduler
from agents.policy.tokenpilot import TokenPilot
from agents.policy.tokenpilot.stepclock import StepClock
from agents.policy.types import ClusterView
from sim.engine.fleet import FleetSpec, parse_fleet
from sim.engine.instance import Instance
from sim.evaluation.capacity import interactive_share
from sim.evaluation.metrics import report
from sim.evaluation.scoreboard import ENGINES, WORKLOADS, ScoredWorkload
from sim.loop.config import SimConfig
from sim.loop.deciders import scheduler_for
from sim.loop.runner import Simulation
from sim.workloads.sources import open_workload

MODES = ("clock", "stream", "exact")
DELAY_S = 0.02
"""How late ``stream`` sees each step boundary: the scoreboard's signal delay (KV events, heartbeats)."""


CAPACITY = {
    ("mooncake", "default"): 1.98,
    ("mooncake", "perturbed"): 0.505,
    ("mooncake-spread", "default"): 2.46,
    ("mooncake-spread", "perturbed"): 1.45,
    ("synthetic", "default"): 9.56,
    ("synthetic", "perturbed"): 5.94,
    ("azure-code", "default"): 3.25,
    ("azure-code", "perturbed"): 3.99,
}
"""TokenPilot's SLO capacity per (workload, engine) in the README's scoreboard run."""


@dataclass(frozen=True, slots=True)
class Cell:
    workload: ScoredWorkload  # the scoreboard's (trace spec, arrival jitter)
    engine: str
    rate_scale: float

    @property
    def name(self) -> str:
        return f"{self.workload.name}/{self.engine}"


CELLS = tuple(Cell(w, engine, CAPACITY[(w.name, engine)]) for w in WORKLOADS for engine in ENGINES)


class EngineClock(StepClock):
    """A step clock that reads the simulated engines' steps (``instances``, set once the
    simulation has built them): exactly (``delay_s`` None) or as the last boundary ``delay_s``
    ago and that step's length."""

    def __init__(self, delay_s: float | None) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.instances: dict[str, Instance] = {}

    def wait(
        self,
        view: ClusterView,
        now_s: float,
        open_requests: IntArray,
        batch: IntArray | FloatArray,
        step_s: FloatArray,
        scale: FloatArray,
    ) -> FloatArray:
        own = super().wait(view, now_s, open_requests, batch, step_s, scale)
        for row, instance_id in enumerate(view.instance_ids):
            engine = self.instances[instance_id]
            if self.delay_s is None:
                end = engine.step_end_after(now_s)
                own[row] = 0.0 if end is None else max(end - now_s, 0.0)
                continue
            seen = engine.last_step(now_s - self.delay_s)
            if own[row] > 0 and seen is not None and now_s - seen[0] <= 2 * seen[1]:
                own[row] = seen[1] - (now_s - seen[0]) % seen[1]
        return own


def _scheduler(mode: str, fleet: FleetSpec, config: SimConfig) -> tuple[Scheduler, EngineClock | None]:
    scheduler = scheduler_for("tokenpilot", fleet, config)
    if mode == "clock":
        return scheduler, None
    router = scheduler.instance_selection
    assert isinstance(router, TokenPilot)
    clock = EngineClock(None if mode == "exact" else DELAY_S)
    router.clock = clock
    return scheduler, clock


def measure(cell: Cell, mode: str, seed: int) -> tuple[float | None, float]:
    """TokenPilot's TTFT MAPE and its interactive SLO share (the capacity judge's) in one run."""
    config = SimConfig(seed=seed)
    trace = open_workload(cell.workload.spec, config.seed).jittered(cell.workload.jitter_s, config.seed)
    fleet = parse_fleet(ENGINES[cell.engine])
    scheduler, clock = _scheduler(mode, fleet, config)
    sim = Simulation(trace.scaled(cell.rate_scale), fleet, scheduler, config)
    if clock is not None:
        clock.instances = {engine.spec.instance_id: engine for engine in sim.instances}
    run = sim.run()
    value = report(run.attempts, run.window, config.slo_classes, run.busy_s)["ttft_prediction_mape"]
    share = interactive_share(run.attempts, run.window, config)
    return None if value is None else float(value), share  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phase", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], choices=[c.name for c in CELLS])
    parser.add_argument("--rate-scale", type=float, help="run every cell at this scale, not its capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or not (args.rate_scale is None or 0 < args.rate_scale <= 1000):
        parser.error("--jobs must be >= 1 and --rate-scale in (0, 1000]")
    cells = [c for c in CELLS if not args.only or c.name in args.only]
    if args.rate_scale is not None:
        cells = [replace(c, rate_scale=args.rate_scale) for c in cells]
    runs = [(cell, mode) for cell in cells for mode in MODES]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(measure, *zip(*runs, strict=True), [args.seed] * len(runs)))
    by_run = dict(zip(runs, results, strict=True))
    late_ms = DELAY_S * 1000
    print(f"TokenPilot, seed {args.seed} (stream: every step boundary {late_ms:.0f} ms late)")
    print(
        f"{'cell':<28}{'x':>7}"
        + "".join(f"{'MAPE ' + m:>14}" for m in MODES)
        + f"{'clock/exact':>13}"
        + "".join(f"{'share ' + m:>15}" for m in MODES)
    )
    for cell in cells:
        errors = "".join(f"{_pct(by_run[(cell, mode)][0]):>14}" for mode in MODES)
        ratio = _ratio(by_run[(cell, "clock")][0], by_run[(cell, "exact")][0])
        shares = "".join(f"{by_run[(cell, mode)][1]:>15.4f}" for mode in MODES)
        print(f"{cell.name:<28}{cell.rate_scale:>7.3g}{errors}{ratio:>13}{shares}")
    print("clock/exact: TokenPilot's MAPE over the exact-phase oracle's (its floor; target <= 1.15)")
    return 0


def _ratio(value: float | None, floor: float | None) -> str:
    if value is None or floor is None or not (np.isfinite(value) and np.isfinite(floor)) or floor <= 0:
        return "-"
    return f"{value / floor:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
