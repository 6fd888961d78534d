"""Fault suite: what the control plane does under bad input, crashes and outages, in figures.

``python -m bench.faults [--only NAME ...] [--stress N] [--json out/faults.json] [--keep]``
(``make faults``)

Runs the scenarios of ``lab/faults/scenarios/``, each on a fresh stack of its own, one after
another: the Kafka path (``baseline``, ``fuzz``, ``poison``, ``worker_kill``,
``decider_failover``, ``decider_join``, ``dispatcher_kill``, ``store_down_at_start``,
``store_down_mid_run``, ``held_restart``, ``broker_restart``) and the gateway path, clients
calling through ``tokenfleet up``'s gateway (``gateway_engine_kill``, ``gateway_decider_kill``,
``gateway_two_deciders``, ``gateway_kill``, ``gateway_dispatcher_kill``,
``gateway_slow_clients``, ``gateway_broker_restart``, ``gateway_vllm_engine_kill``: real vLLM CPU
servers, ``make engine`` first). It prints one table
row per scenario (stdout), progress on stderr, and with ``--json`` writes
``{"stress": N, "cpus": C, "scenarios": {NAME: {...}}}``. What each scenario does and how each
figure is counted: ``lab/faults`` (its package docstring and each scenario's). A scenario that
fails keeps its figures so far and gets an ``"error"``; the suite goes on.

``--stress N``: a busy machine, reproducibly: N CPU burners (``lab.faults.stress``: child
processes spinning on pure-Python arithmetic at the default priority, one core each when they
get it) run beside each scenario, started before its stack and killed after its figures are
read. The guarantees are judged with and without them; ``cpus`` is the machine's core count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lab.faults import log
from lab.faults.scenarios import SCENARIOS
from lab.faults.suite import run_all
from lab.faults.tally import FIGURES

INJECT_DIR = Path(__file__).resolve().parent / "inject"
"""The store-outage injection the ``store_down_mid_run`` workers load (``sitecustomize.py``)."""

HEADERS = (
    "published", "once", "twice", "exec x2", "lost", "unanswered", "DLQ", "stored", "expected", "p99 s",
    "recov s",
)  # fmt: skip


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A row per scenario: the ``FIGURES`` (``-`` for null), then every other figure as notes."""
    width = max([len("scenario"), *map(len, results)])
    lines = [
        "| " + " | ".join(["scenario".ljust(width), *HEADERS, "notes"]) + " |",
        "|" + "|".join(["-" * (width + 2), *("-" * (len(h) + 2) for h in HEADERS), "-------"]) + "|",
    ]
    for name, figures in results.items():
        cells = [
            _cell(figures.get(key)).rjust(len(header)) for key, header in zip(FIGURES, HEADERS, strict=True)
        ]
        notes = {
            k: v for k, v in figures.items() if k not in FIGURES and k not in ("note", "error", "seconds")
        }
        text = ", ".join(f"{k}={_cell(v)}" for k, v in notes.items())
        if "error" in figures:
            text = f"ERROR {figures['error'].splitlines()[0][:160]}; " + text
        if "note" in figures:
            text = "not run (see note)"
        lines.append("| " + " | ".join([name.ljust(width), *cells, text]) + " |")
    return "\n".join(lines)


def _log_to(path: Path) -> None:
    """This process's logs (the in-process fleet's, the apparatus's, aiokafka's) at INFO with
    timestamps into ``path`` (kept with the workers' logs by ``--keep``); on stderr only our
    own warnings: aiokafka logs every failed connection during the broker restart, and the
    figures say what happened."""
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    to_stderr = logging.StreamHandler()
    to_stderr.setLevel(logging.WARNING)
    to_stderr.addFilter(lambda record: not record.name.startswith("aiokafka"))
    logging.basicConfig(level=logging.INFO, handlers=[to_file, to_stderr], force=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), metavar="NAME", help="run only these")
    parser.add_argument("--json", type=Path, help="write {'scenarios': {NAME: figures}} here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dirs (worker, broker and suite logs)"
    )
    parser.add_argument(
        "--stress", type=int, default=0, metavar="N", help="N CPU burners beside each scenario (default 0)"
    )
    args = parser.parse_args(argv)
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    root = Path(tempfile.mkdtemp(prefix="tokenfleet-faults-"))
    _log_to(root / "suite.log")
    try:
        results = asyncio.run(run_all(names, root, INJECT_DIR, args.stress))
    finally:
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"stress: {args.stress} CPU burners beside each scenario, on {os.cpu_count()} cores")
    print(format_table(results))
    for name, figures in results.items():
        if "note" in figures:
            print(f"\n{name}: {figures['note']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"stress": args.stress, "cpus": os.cpu_count(), "scenarios": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
