"""The worker's readiness marker: a file that exists while a child serves (consuming, tables
recovered).

It names the child's pid, the supervisor's pid, the run token (``Settings.worker_run_token``,
set by whoever started the supervisor) and the start number (the supervisor's count of the
children it started, 1 for the first: ``child_restarts`` reads it); the supervisor removes it
before every (re)start, so a marker is trusted only if it names a live child of this run
(``lab.worker_process.WorkerProcess.wait_ready``). Written whole (rename), removed only by the
process that wrote it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from infra.files import write_atomic
from infra.settings import Settings


def ready_marker(settings: Settings) -> Path:
    """A file that exists while a worker is ready (consuming, tables recovered)."""
    return ready_file(settings.data_dir, settings.app_id)


def ready_file(data_dir: Path, app_id: str) -> Path:
    return data_dir / f"{app_id}.worker.ready"


def write_marker(path: Path, content: dict[str, Any]) -> None:
    """Write the marker whole (a reader never sees half of it)."""
    write_atomic(path, json.dumps(content) + "\n")


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker's content, or ``None`` (absent, or not written by this version)."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def unlink_own(path: Path) -> None:
    """Remove the marker if this process wrote it (a successor's is not ours)."""
    content = read_marker(path)
    if content is not None and content.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def child_restarts(path: Path, supervisor_pid: int) -> int | None:
    """How many times the supervisor ``supervisor_pid`` has restarted its child (its start number
    less 1), as the marker of its ready child says; None: no child of that supervisor is ready."""
    content = read_marker(path)
    if content is None or content.get("supervisor") != supervisor_pid:
        return None
    start = content.get("start")
    return start - 1 if isinstance(start, int) and start >= 1 else None
