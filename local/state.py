"""What a stack of ``tokenfleet up`` leaves in its directory, and its processes as Linux sees them.

The directory holds ``plan.json`` (what to start: written by ``up``, read by the supervisor),
``state.json`` (what runs: written by the supervisor whenever something changes, read by
``status``, ``down`` and ``up`` itself), ``supervisor.lock`` (held by the supervisor while it
lives), the API key files, the inventory and one log per part.

A process is named by its pid *and* its start time (``/proc/PID/stat``, clock ticks since boot):
a pid the kernel gave to another process since is not taken for one of the stack's. Every part
leads a process group of its own (a session), so a signal to the group reaches what the part
spawned (the worker's child, vLLM's engine core). Every process of a stack also carries
``TOKENFLEET_UP_DIR=<dir>`` in its environment, so ``down`` finds even one that left its group.
Linux only: processes are read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.files import write_atomic

MARKER_ENV = "TOKENFLEET_UP_DIR"
PLAN_FILE = "plan.json"
STATE_FILE = "state.json"
LOCK_FILE = "supervisor.lock"
SUPERVISOR_LOG = "supervisor.log"
KEY_FILE = "api-key"  # the local key in clear (mode 0600), so `tokenfleet status` can show it again
KEYS_FILE = "api-keys.yaml"  # the gateway's key file (SHA-256 of each key)
INVENTORY_FILE = "inventory.yaml"
PROC = Path("/proc")


@dataclass
class PartState:
    """One part as it runs: what it is, where it answers, and its current process. ``restarts``:
    how many times the stack's supervisor started it again; ``child_restarts``: how many times
    the part started its own child again, over all its processes (the worker's decider)."""

    name: str
    # broker, vllm, emulated (an emulated vLLM server), worker, dispatcher, gateway, planner;
    # engine: an inventory's server (not the stack's)
    kind: str
    address: str  # what the table shows: host:port or a URL
    probe: str  # http://... (200 = ready) or tcp://host:port (accepts = ready); "" none
    log: str
    pid: int | None = None
    start_time: int | None = None
    # waiting, starting, ready, exited, restarting, stopped, failed, external; a server slot of a
    # planned stack also standby (not running), loading, draining, stopping (local/follower.py)
    state: str = "waiting"
    restarts: int = 0
    detail: str = ""
    child_restarts: int = 0


@dataclass
class StackState:
    """The whole stack: ``phase`` is starting, ready, failed, stopping or stopped."""

    dir: str
    mode: str
    phase: str
    supervisor_pid: int
    supervisor_start: int | None
    bootstrap: str
    gateway_url: str
    model: str
    api_key_file: str
    clickhouse: str
    data_dir: str
    parts: list[PartState] = field(default_factory=list)
    error: str = ""
    updated: float = 0.0
    policy: str = ""  # the worker's routing policy

    def part(self, name: str) -> PartState:
        return next(p for p in self.parts if p.name == name)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StackState:
        raw: dict[str, Any] = json.loads(text)
        raw["parts"] = [PartState(**part) for part in raw.get("parts", [])]
        return cls(**raw)


def read_state(directory: Path) -> StackState | None:
    """The stack's state, or ``None`` when the directory has none (or one this version cannot read)."""
    try:
        return StackState.from_json((directory / STATE_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None


def write_state(directory: Path, state: StackState) -> None:
    """Write it whole (a reader never sees half of it)."""
    state.updated = time.time()
    write_atomic(directory / STATE_FILE, state.to_json())


# -- processes ---------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)``: state, ppid, pgrp, ...; None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if there is no such process."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int | None, started: int | None) -> bool:
    """That process (pid and start time) still runs: not gone, not a zombie, not another one."""
    if pid is None:
        return False
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == started


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X"):
                found.append((int(entry.name), fields))
    return found


def group_members(group: int | None) -> list[int]:
    """The live processes of process group ``group`` (a part's, led by its first pid)."""
    if group is None:
        return []
    return [pid for pid, fields in _processes() if int(fields[2]) == group]


def marked(directory: Path) -> list[int]:
    """Live processes whose environment names this stack's directory (``MARKER_ENV``)."""
    marker = f"{MARKER_ENV}={directory}".encode()
    found = []
    for pid, _fields in _processes():
        with contextlib.suppress(OSError):
            if marker in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                found.append(pid)
    return [pid for pid in found if pid != os.getpid()]


def signal_group(group: int | None, signum: int) -> None:
    """Signal every process of the group, if it has any (a group without members has no id to reuse)."""
    if group is not None and group_members(group):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def stop_groups(groups: list[int], signum: int, grace_s: float) -> list[int]:
    """``signum`` to each group, SIGKILL to what is left after ``grace_s``; the groups still
    alive 5 s after that (none, normally)."""
    for group in groups:
        signal_group(group, signum)
    deadline = time.monotonic() + grace_s
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for group in groups:
        signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [g for g in groups if group_members(g)]


def our_group(part: PartState, directory: Path) -> list[int]:
    """The live members of ``part``'s process group, if that group is still the part's: its
    leader is the recorded process, or a member carries the stack's marker (a group id is not
    given to a new group while members of the old one live)."""
    members = group_members(part.pid)
    if members and (alive(part.pid, part.start_time) or set(members) & set(marked(directory))):
        return members
    return []


def left_over(directory: Path, state: StackState | None) -> list[int]:
    """The stack's processes still alive: the supervisor, every part's group, anything marked."""
    pids: set[int] = set(marked(directory))
    if state is not None:
        if alive(state.supervisor_pid, state.supervisor_start):
            pids.add(state.supervisor_pid)
        for part in state.parts:
            if part.kind != "engine":
                pids.update(our_group(part, directory))
    return sorted(pids)
