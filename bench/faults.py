"""Fault suite: what the control plane does under bad input, crashes and outages, in figures.

``python -m bench.faults [--only NAME ...] [--json out/faults.json]`` (``make faults``)

Runs the scenarios of ``lab/faults/scenarios/`` (``baseline``, ``fuzz``, ``poison``,
``worker_kill``, ``store_down_at_start``, ``store_down_mid_run``, ``held_restart``,
``broker_restart``), each on a fresh stack of its own, one after another. It prints one table
row per scenario (stdout), progress on stderr, and with ``--json`` writes
``{"scenarios": {NAME: {...}}}``. What each scenario does and how each figure is counted:
``lab/faults`` (its package docstring and each scenario's). A scenario that fails keeps its
figures so far and gets an ``"error"``; the suite goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), metavar="NAME", help="run only these")
    parser.add_argument("--json", type=Path, help="write {'scenarios': {NAME: figures}} here")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs (worker and broker logs)")
    args = parser.parse_args(argv)
    # aiokafka logs every failed connection during the broker restart: the figures say what
    # happened, and the workers' own logs are in their data dirs (--keep).
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    root = Path(tempfile.mkdtemp(prefix="tokenfleet-faults-"))
    try:
        results = asyncio.run(run_all(names, root, INJECT_DIR))
    finally:
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(format_table(results))
    for name, figures in results.items():
        if "note" in figures:
            print(f"\n{name}: {figures['note']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"scenarios": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
