"""``tokenfleet worker`` as a child process: the one helper the demo, the benchmarks and the
integration tests start workers with.

The child gets the parent's environment plus ``TOKENFLEET_*`` overrides (the settings object
reads them), writes its output to ``log_path`` and is ready when its readiness marker
(``worker.ready.ready_file``: consuming, tables recovered) names a live worker of
this run: ``tokenfleet worker`` is a supervisor that runs the Faust worker as its own child and
restarts it, so the marker carries the serving child's pid, the supervisor's pid and the run
token this helper passed (``TOKENFLEET_WORKER_RUN_TOKEN``). A marker left by an earlier run, or by a child
that died, is never taken for readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from worker.ready import read_marker, ready_file


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
        self.run_token = uuid.uuid4().hex
        self.data_dir = data_dir
        env = {**os.environ, **(settings or {}), "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap}
        env["TOKENFLEET_WORKER_RUN_TOKEN"] = self.run_token
        env["TOKENFLEET_DATA_DIR"] = str(data_dir)
        app_id = env.get("TOKENFLEET_APP_ID", "tokenfleet")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = ready_file(data_dir, app_id)
        self.ready_file.unlink(missing_ok=True)  # a stale marker of an earlier worker
        self.log_path = log_path or data_dir / f"{app_id}-{time.time_ns()}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", "--loglevel", loglevel],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        """The serving worker's pid (the supervisor's child named by a valid marker); the
        supervisor's pid while no child is ready."""
        child = self.child_pid()
        return child if child is not None else self.process.pid

    @property
    def supervisor_pid(self) -> int:
        return self.process.pid

    def child_pid(self) -> int | None:
        """The pid of the ready worker child of this run, or ``None``."""
        content = read_marker(self.ready_file)
        if content is None or content.get("run") != self.run_token:
            return None
        if content.get("supervisor") != self.process.pid or self.process.poll() is not None:
            return None
        pid = content.get("pid")
        if not isinstance(pid, int) or not _alive_child_of(pid, self.process.pid):
            return None
        return pid

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
        """SIGTERM (graceful: the supervisor stops its child, then exits) or SIGKILL (the
        supervisor and its child); waits for the exits and returns the supervisor's code."""
        child = self.child_pid()
        if self.process.poll() is None:
            if kill and child is not None:  # its parent's death kills it too; do not rely on it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=10)
        self._log.close()
        if child is not None:  # bounded wait until the child is gone too
            deadline = time.monotonic() + 10
            while _alive_child_of(child, None) and time.monotonic() < deadline:
                time.sleep(0.05)
        if kill:
            self.ready_file.unlink(missing_ok=True)  # a killed worker cannot remove its marker
        return code

    def metrics_url(self) -> str:
        """The worker's ``/metrics`` address, from the line it logs at start-up."""
        found = re.findall(r"metrics (http://\S+/metrics)", self.log_path.read_text(errors="replace"))
        if not found:
            raise RuntimeError(f"the worker logged no metrics address:\n{self.log()}")
        return str(found[-1])  # the latest child's (a restarted child may take another port)

    def probe_url(self, path: str) -> str:
        """The address of the worker's ``path`` (``/health``, ``/ready``) beside ``/metrics``."""
        return self.metrics_url().removesuffix("/metrics") + path

    def log(self) -> str:
        """The last 4 000 characters of its output."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def _ready(self, deadline: float, timeout_s: float) -> bool:
        if self.child_pid() is not None:
            return True
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with code {self.process.returncode}:\n{self.log()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker was not ready within {timeout_s:.0f} s:\n{self.log()}")
        return False


def _alive_child_of(pid: int, parent: int | None) -> bool:
    """``pid`` runs (not a zombie) and, if ``parent`` is given, is its child (Linux ``/proc``;
    elsewhere: runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return parent is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    state, ppid = fields[0], int(fields[1])
    return state not in {"Z", "X"} and (parent is None or ppid == parent)
