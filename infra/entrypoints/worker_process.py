"""``tokenfleet worker`` as a child process: the one helper the demo, the benchmarks and the
integration tests start workers with.

The child gets the parent's environment plus ``TOKENFLEET_*`` overrides (the settings object
reads them), writes its output to ``log_path`` and is ready when its readiness marker exists
(``infra.entrypoints.worker.ready_file``: consuming, tables recovered).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from infra.entrypoints.worker import ready_file


class WorkerProcess:
    """Start one worker with ``settings`` (``TOKENFLEET_*`` name -> value) over ``bootstrap``."""

    def __init__(
        self,
        bootstrap: str,
        data_dir: Path,
        settings: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        loglevel: str = "warn",
    ) -> None:
        env = {**os.environ, **(settings or {}), "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap}
        env["TOKENFLEET_DATA_DIR"] = str(data_dir)
        app_id = env.get("TOKENFLEET_APP_ID", "tokenfleet")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = ready_file(data_dir, app_id)
        self.ready_file.unlink(missing_ok=True)  # a stale marker of an earlier worker
        self.log_path = log_path or data_dir / f"{app_id}-{time.time_ns()}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "infra.entrypoints.cli", "worker", "--loglevel", loglevel],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Return once the worker is ready; ``RuntimeError`` (with its log) if it exits or is
        not ready in time."""
        deadline = time.monotonic() + timeout_s
        while not self._ready(deadline, timeout_s):
            time.sleep(0.1)

    async def wait_ready_async(self, timeout_s: float = 90.0) -> None:
        """``wait_ready`` without blocking the event loop."""
        deadline = time.monotonic() + timeout_s
        while not self._ready(deadline, timeout_s):
            await asyncio.sleep(0.1)

    def stop(self, kill: bool = False) -> int:
        """SIGTERM (graceful) or SIGKILL; waits for the exit and returns its code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=10)
        self._log.close()
        if kill:
            self.ready_file.unlink(missing_ok=True)  # a killed worker cannot remove its marker
        return code

    def metrics_url(self) -> str:
        """The worker's ``/metrics`` address, from the line it logs at start-up."""
        found = re.search(r"metrics (http://\S+/metrics)", self.log_path.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"the worker logged no metrics address:\n{self.log()}")
        return found.group(1)

    def log(self) -> str:
        """The last 4 000 characters of its output."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def _ready(self, deadline: float, timeout_s: float) -> bool:
        if self.ready_file.exists():
            return True
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with code {self.process.returncode}:\n{self.log()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker was not ready within {timeout_s:.0f} s:\n{self.log()}")
        return False
