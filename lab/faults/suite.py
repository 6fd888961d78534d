"""Running the fault scenarios: each on a fresh run, its figures kept even when it fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from lab.faults import SCENARIO_LIMIT_S, log
from lab.faults.gateway_harness import GatewayRun, GatewayScenario
from lab.faults.harness import Run
from lab.faults.scenarios import NOTES, SCENARIOS, Scenario
from lab.faults.stress import Stress
from lab.faults.tally import FIGURES


async def run_scenario(
    name: str, root: Path, inject_dir: Path | None = None, stress: int = 0
) -> dict[str, Any]:
    """One scenario on a fresh broker and data dir (``root/name``): its figures, with ``error``
    if it failed (its figures are then those so far) and ``seconds``; cancelled
    after ``SCENARIO_LIMIT_S``. ``inject_dir``: the store-outage injection (``Run.inject_dir``);
    ``stress``: CPU burners running from before the stack starts until its figures are read
    (``lab.faults.stress``)."""
    scenario = SCENARIOS[name]
    if scenario is None:
        return {**dict.fromkeys(FIGURES), "note": NOTES[name]}
    with Stress(stress):
        if isinstance(scenario, GatewayScenario):  # the gateway path: a stack as `up` starts it
            return await run_gateway_scenario(name, scenario, root)
        return await _run(name, scenario, root, inject_dir)


async def _run(name: str, scenario: Scenario, root: Path, inject_dir: Path | None) -> dict[str, Any]:
    run = Run(name, root / name, inject_dir=inject_dir)
    run.data_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    error = ""
    log(f"{name}: starting (data {run.data_dir})")
    try:
        await asyncio.wait_for(scenario(run), timeout=SCENARIO_LIMIT_S)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"{name}: failed: {error}")
        for worker in run.workers[-1:]:
            log(f"{name}: last worker's log tail:\n{worker.log()[-1500:]}")
    finally:
        await run.close()
    if run.collector is not None:
        run.collector.dump(run.data_dir / "collected.jsonl")
    return await _closed(name, run, error, began)


async def run_gateway_scenario(name: str, scenario: GatewayScenario, root: Path) -> dict[str, Any]:
    """One gateway scenario on a fresh stack in ``root/name``: its figures, with ``error`` if it
    failed (its figures are then those so far) and ``seconds``."""
    run = GatewayRun(name, root / name, engines=scenario.engines, servers=scenario.servers)
    run.data_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    error = ""
    log(f"{name}: starting (stack {run.stack_dir})")
    try:
        await run.start()
        await asyncio.wait_for(scenario.body(run), timeout=SCENARIO_LIMIT_S)
        await asyncio.sleep(3.0)  # anything decided, executed or answered twice shows up
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"{name}: failed: {error}")
    finally:
        await run.close()
    with contextlib.suppress(Exception):
        run.dump(run.data_dir / "client.json")
    return await _closed(name, run, error, began)


class _Judged(Protocol):
    def figures(self) -> dict[str, Any]: ...
    def read_store(self) -> Any: ...
    def missing_completions(self, stored: Any) -> dict[str, Any]: ...


async def _closed(name: str, run: _Judged, error: str, began: float) -> dict[str, Any]:
    """The figures of a run that has stopped: what was seen, what the store kept (read once
    every process that held it stopped), ``error`` if it failed and ``seconds``; logged."""
    figures = run.figures()
    try:
        stored = await asyncio.to_thread(run.read_store)
        figures["completions_stored"] = None if stored is None else len(stored)
        if stored is not None:
            figures.update(run.missing_completions(stored))
    except Exception as exc:
        figures["store_error"] = f"{type(exc).__name__}: {exc}"[:500]
    if error:
        figures["error"] = error
    figures["seconds"] = round(time.monotonic() - began, 1)
    log(f"{name}: done in {figures['seconds']:.0f} s: {json.dumps(figures)}")
    return figures


async def run_all(
    names: Sequence[str], root: Path, inject_dir: Path | None = None, stress: int = 0
) -> dict[str, dict[str, Any]]:
    """The named scenarios one after another (never two at once: they share the machine), each
    with ``stress`` CPU burners beside it."""
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = await run_scenario(name, root, inject_dir, stress)
    return results
