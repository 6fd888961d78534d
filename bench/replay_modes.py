"""Where a run's TTFT median comes from: each engine's calls by arrival window, observed and replayed.

``python -m bench.replay_modes DATA [--draws N] [--windows S,S,...] [--json J]``

DATA is a directory ``python -m bench.replay --data DATA`` kept: its store and the export of the
run of the policy that ran (``replay/``: workload, fleet and fitted profiles). For that run it
gives, per engine, its calls' TTFT p10 and p50, overall and per arrival window (``--windows``:
the windows' starts, seconds after the first arrival; the last one runs to the end), and the
TTFT p50 of all calls: observed (the store's ok completions) and replayed (the export simulated
under the same policy, seeds ``seed`` to ``seed + N - 1`` of the bench's options, as the bench's
``placement`` simulates it). The replayed engines are not the real ones: engines are listed
fastest first (by their median TTFT), so the n-th engine of a replay stands beside the n-th of
the run. Useful where a policy leaves one engine fast and another slow: the median of all calls
then lies in the gap between the two, and which calls fill it says why a replay misses it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay import RAN, calibrated_replay

DEFAULT_WINDOWS = (0.0, 5.0, 10.0, 20.0)


def engine_figures(calls: Sequence[tuple[str, float, float]], windows: Sequence[float]) -> dict[str, Any]:
    """``calls`` as (engine, arrival s after the first, TTFT s): the p50 of all, and per engine
    (fastest first) its calls, p10, p50 and per window (``windows``' starts) its calls and p50."""
    bounds = [*windows, float("inf")]
    engines: dict[str, list[tuple[float, float]]] = {}
    for engine, arrival, ttft in calls:
        engines.setdefault(engine, []).append((arrival, ttft))
    listed: list[dict[str, Any]] = []
    for engine, mine in engines.items():
        ttfts = np.array([ttft for _, ttft in mine])
        by_window = []
        for start, end in itertools.pairwise(bounds):
            inside = [ttft for arrival, ttft in mine if start <= arrival < end]
            by_window.append({"from_s": start, "calls": len(inside), "p50_s": _median(inside)})
        listed.append(
            {
                "engine": engine,
                "calls": len(mine),
                "p10_s": float(np.quantile(ttfts, 0.1)),
                "p50_s": float(np.median(ttfts)),
                "windows": by_window,
            }
        )
    listed.sort(key=lambda figures: figures["p50_s"])
    return {"p50_s": _median([ttft for _, _, ttft in calls]), "engines": listed}


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def observed_calls(data: Path, run: str) -> list[tuple[str, float, float]]:
    """The run's ok completions in DATA's store as (instance, arrival after the first, TTFT)."""
    from infra.clickhouse import connect

    with connect(f"chdb:///{(data / 'clickhouse').resolve()}") as client:
        rows = client.query(
            "SELECT instance_id, toFloat64(arrival_ts), ttft_s FROM completions "
            "WHERE run_id = {run:String} AND status = 'ok' ORDER BY arrival_ts",
            parameters={"run": run},
        ).result_rows
    if not rows:
        raise ValueError(f"{data}: no completed call of run {run!r} in the store")
    first = rows[0][1]
    return [(instance, arrival - first, ttft) for instance, arrival, ttft in rows]


def replayed_calls(export: Path, policy: str, seed: int) -> list[tuple[str, float, float]]:
    """The export's workload simulated under ``policy`` on its fleet and fitted profiles, as
    (instance, arrival, TTFT) of each attempt that got a first token."""
    from sim.loop.config import SimConfig
    from sim.loop.runner import simulate

    workload, fleet = calibrated_replay(export)
    attempts = simulate(workload, fleet, policy, SimConfig(seed=seed)).attempts
    return [
        (a.instance.spec.instance_id, a.arrival_s, a.first_token_s - a.arrival_s)
        for a in attempts
        if a.instance is not None and a.first_token_s is not None and a.status == "ok"
    ]


def modes(data: Path, draws: int = 3, windows: Sequence[float] = DEFAULT_WINDOWS) -> dict[str, Any]:
    """The document: ``run``, ``observed`` and ``replayed`` (one per draw, with its ``seed``)."""
    predicted = json.loads((data / "replay-predicted.json").read_text())
    run, seed = predicted["run"], int(predicted["seed"])
    replayed = []
    for draw in range(seed, seed + draws):
        figures = engine_figures(replayed_calls(data / "replay", RAN, draw), windows)
        replayed.append({"seed": draw, **figures})
    return {
        "run": run,
        "policy": RAN,
        "windows_s": list(windows),
        "observed": engine_figures(observed_calls(data, run), windows),
        "replayed": replayed,
    }


def report_lines(document: dict[str, Any]) -> list[str]:
    starts = document["windows_s"]
    header = "  ".join(f"{start:g}s+" for start in starts)
    lines = [f"run {document['run']} ({document['policy']}): TTFT p50 / p10 per engine, fastest first;"]
    lines.append(f"  p50 per arrival window ({header}), calls in brackets")
    sources = [("observed", document["observed"])]
    sources += [(f"replay {draw['seed']}", draw) for draw in document["replayed"]]
    for name, figures in sources:
        lines.append(f"{name}: all calls p50 {_seconds(figures['p50_s'])}")
        for rank, engine in enumerate(figures["engines"]):
            windows = "  ".join(f"{_seconds(w['p50_s'])} ({w['calls']})" for w in engine["windows"])
            lines.append(
                f"  engine {rank} ({engine['engine']}, {engine['calls']} calls): "
                f"p50 {_seconds(engine['p50_s'])}  p10 {_seconds(engine['p10_s'])}  |  {windows}"
            )
    return lines


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay_modes", description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path, metavar="DATA", help="a directory bench.replay --data kept")
    parser.add_argument("--draws", type=int, default=3, metavar="N")
    parser.add_argument("--windows", default=",".join(f"{w:g}" for w in DEFAULT_WINDOWS), metavar="S,S,...")
    parser.add_argument("--json", default=None, metavar="J")
    args = parser.parse_args(argv)
    try:
        windows = sorted(float(start) for start in args.windows.split(","))
        if args.draws < 1 or not windows or windows[0] < 0:
            raise ValueError("--draws must be >= 1 and --windows starts >= 0")
        document = modes(args.data, args.draws, windows)
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench.replay_modes: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(document)))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
