"""A whole TokenFleet on this machine, supervised: what ``tokenfleet up``, ``status`` and ``down`` do.

The folder is the product's one-machine deployment: every part a process, started and watched
by one supervisor. It holds the plan (``plan.py``), the supervisor (``supervisor.py``), the
stack's files and processes (``state.py``), what ``up`` and ``status`` print (``report.py``)
and the engines a stack may start itself: vLLM CPU servers (``vllm_launcher.py``, over a model
directory or the tiny test model of ``tiny_model.py``) and emulated vLLM servers
(``emulated_vllm/``: try the stack without vLLM or GPUs). It imports the deployables and the
adapters, never the lab, the command line or ``bench``.

``up`` plans the stack (``local.plan``: the embedded broker unless one is configured, with
``--engines local`` vLLM CPU servers or with ``--engines emulated`` emulated vLLM servers and
their inventory, the worker, the dispatcher, the gateway and an API key for local use; with
``--planner`` also the planner, whose plans the supervisor follows: ``local/follower.py``), then
starts the supervisor (``local.supervisor``) as a detached process (``python -m local
DIR``; with ``foreground``, in this process) and returns once every part is ready, or raises
``UpFailed`` naming the part that failed and its log (everything already stopped). One stack per
directory: the supervisor holds an exclusive lock on ``supervisor.lock`` while it lives (``up``
takes it first and hands it over), and ``up`` refuses a directory where a process of an earlier
stack still runs.

``status`` reads ``state.json`` and asks every process whether it is still the one started
(pid and start time) and every part's probe whether it is ready; a planned stack's servers
(``--planner``) show the follower's state: ``loading``, ``ready``, ``draining``, ``stopping``
or ``standby``. ``down`` asks the supervisor to
stop the stack (SIGTERM: it stops the parts in order), then makes sure: each part's process
group gets SIGTERM and SIGKILL, and any process still carrying the stack's marker
(``TOKENFLEET_UP_DIR`` in its environment) SIGKILL; it reports what, if anything, is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from infra.files import write_atomic
from infra.settings import Settings
from local.plan import ENGINES, Plan, UpOptions, make_plan
from local.state import (
    LOCK_FILE,
    MARKER_ENV,
    PLAN_FILE,
    STATE_FILE,
    SUPERVISOR_LOG,
    StackState,
    alive,
    left_over,
    marked,
    our_group,
    read_state,
    stop_groups,
    write_state,
)
from local.supervisor import STOP_ORDER, Supervisor, probe

__all__ = ["ENGINES", "UpFailed", "UpOptions", "down", "refresh", "up"]


class UpFailed(RuntimeError):
    """The stack did not start: the message names the part and its log (everything is stopped)."""


def _lock(directory: Path) -> IO[bytes]:
    """The directory's lock, taken; ``ValueError`` if a supervisor holds it (a stack is up)."""
    lock = (directory / LOCK_FILE).open("ab")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(_already_up(directory, "a stack is already up in")) from None
    return lock


def _already_up(directory: Path, what: str) -> str:
    return f"{what} {directory}: run `tokenfleet down --dir {directory}` first, or pass another --dir"


def up(
    options: UpOptions,
    settings: Settings,
    *,
    foreground: bool = False,
    on_ready: Callable[[StackState], None] | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> StackState:
    """Start the stack of ``options`` and return its state once every part is ready (detached),
    or run it until SIGINT / SIGTERM (``foreground``; ``on_ready`` is called when it is ready).
    ``ValueError``: options that cannot work or a stack already up there; ``UpFailed``: a part
    failed to start."""
    directory = options.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    lock = _lock(directory)
    try:
        running = left_over(directory, read_state(directory))
        if running:
            raise ValueError(_already_up(directory, f"processes {running} of an earlier stack still run in"))
        plan = make_plan(options, settings)
        say(f"up: policy {plan.policy}, engines {plan.mode}, in {directory}")
        write_atomic(directory / PLAN_FILE, plan.to_json())
        (directory / STATE_FILE).unlink(missing_ok=True)
        if foreground:
            supervisor = Supervisor(plan, on_ready=on_ready, say=say)
            if supervisor.run() != 0:
                raise UpFailed(supervisor.state.error or "the stack stopped while starting")
            return supervisor.state
        process = _spawn(directory, lock)
    finally:
        lock.close()  # the supervisor holds its own copy
    try:
        return _wait_started(directory, process, say)
    except KeyboardInterrupt:
        process.send_signal(signal.SIGTERM)  # it stops what it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=120)
        raise


def _spawn(directory: Path, lock: IO[bytes]) -> subprocess.Popen[bytes]:
    with (directory / SUPERVISOR_LOG).open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "local", str(directory), str(lock.fileno())],
            env={**os.environ, MARKER_ENV: str(directory)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(lock.fileno(),),
            start_new_session=True,  # outlives this command and its terminal
        )


def _wait_started(
    directory: Path, process: subprocess.Popen[bytes], say: Callable[[str], None]
) -> StackState:
    told: dict[str, str] = {}
    while True:
        state = read_state(directory)
        if state is not None and state.supervisor_pid == process.pid:
            for part in state.parts:
                if part.state in ("starting", "ready") and told.get(part.name) != part.state:
                    told[part.name] = part.state
                    slow = (
                        "; vLLM on CPU takes 30-60 s"
                        if part.kind == "vllm" and part.state == "starting"
                        else ""
                    )
                    say(f"up: {part.name} {part.state} ({part.detail}{slow})")
            if state.phase == "ready":
                return state
            if state.phase in ("failed", "stopped") or state.error:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=180)  # it stops the parts already started
                raise UpFailed(state.error or "the stack stopped while starting")
        code = process.poll()
        if code is not None:
            state = read_state(directory)
            if state is not None and state.supervisor_pid == process.pid and state.error:
                raise UpFailed(state.error)
            raise UpFailed(f"the supervisor exited with code {code}; its log: {directory / SUPERVISOR_LOG}")
        time.sleep(0.25)


def refresh(directory: Path) -> tuple[StackState, dict[str, str]] | None:
    """The stack's state and, per part, what it is now: ``ready``, ``not ready`` (runs, its
    probe does not answer yet), ``up``/``down`` (an inventory's engines) or its last recorded
    state (``stopped``, ``exited``, ``failed``, ...) when its process is gone. None: no stack."""
    state = read_state(directory.resolve())
    if state is None:
        return None
    now: dict[str, str] = {}
    supervised = alive(state.supervisor_pid, state.supervisor_start)
    if not supervised and state.phase in ("starting", "ready", "stopping"):
        state.phase = "supervisor gone: run tokenfleet down"
    for part in state.parts:
        if part.kind == "engine":
            now[part.name] = "up" if probe(part.probe) else "down"
        elif alive(part.pid, part.start_time):
            ready = probe(part.probe)
            if part.state in ("draining", "stopping") or (part.state == "loading" and not ready):
                now[part.name] = part.state  # the follower's: it says what the probe cannot
            else:
                now[part.name] = (
                    "ready" if ready else ("restarting" if part.state == "restarting" else "not ready")
                )
        else:
            kept = ("exited", "failed", "waiting", "standby")
            recorded = part.state if part.state in kept else "stopped"
            now[part.name] = recorded if supervised else "stopped"
    return state, now


def down(directory: Path, timeout_s: float = 120.0) -> tuple[list[int], list[int]]:
    """Stop the stack in ``directory``: the pids of it that ran before (none: nothing to stop)
    and those still alive afterwards (none, normally)."""
    directory = directory.resolve()
    state = read_state(directory)
    running = left_over(directory, state)
    if not running:
        return [], []
    if state is not None and alive(state.supervisor_pid, state.supervisor_start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(state.supervisor_pid, state.supervisor_start) and time.monotonic() < deadline:
            time.sleep(0.2)
    if state is not None:  # a supervisor killed, or too slow: stop what it left, in order
        for kind in STOP_ORDER:
            groups = [p.pid for p in state.parts if p.kind == kind and p.pid and our_group(p, directory)]
            if groups:
                stop_groups(groups, signal.SIGTERM, 10.0)
        if alive(state.supervisor_pid, state.supervisor_start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid, signal.SIGKILL)
    for pid in marked(directory):  # anything of the stack outside the parts' groups
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while left_over(directory, state) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):  # the parts' scratch dirs
        for spec in Plan.from_json((directory / PLAN_FILE).read_text()).parts:
            if spec.scratch:
                shutil.rmtree(spec.scratch, ignore_errors=True)
    fresh = read_state(directory)
    if fresh is not None and fresh.phase not in ("stopped", "failed"):
        fresh.phase = "stopped"
        for part in fresh.parts:
            if part.kind != "engine" and part.state not in ("failed", "exited"):
                part.state = "stopped"
        write_state(directory, fresh)
    return running, left_over(directory, state)
