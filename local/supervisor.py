"""The supervisor of a ``tokenfleet up`` stack: one process that owns the parts.

It starts every part of the plan as a child in a session of its own (its output appended to the
part's log), each once the parts it needs are ready (the broker and the engine servers, vLLM or
emulated, at once, the worker on the broker, the dispatcher on the worker and the servers, the
gateway on the dispatcher), and waits until each answers its probe: the broker accepts
connections (then it has the project's topics), a server's ``/health``, the worker's and the
dispatcher's ``/ready``, the gateway's ``/ready``. A part that exits or is not ready in time
fails the start: everything is stopped and the state says which part and where its log is.

Once all are ready it watches them: a part that exits is started again after a back-off (1 s,
doubling to 30 s; back to 1 s once a part ran a minute), the broker's topics created again
(its storage is memory: a restarted embedded broker is empty; the worker restarts its own child
when its broker connection breaks). Each part's restarts are counted in its state, and so are
those a part makes of its own child (the worker's supervisor restarting its decider), read from
the part's ``restarts_file`` (the worker's ready marker) while it runs. SIGTERM or SIGINT stops
the stack in order — gateway, dispatcher, worker, the engine servers, the broker — each part's
process group signalled (SIGINT for the dispatcher and the gateway, as Ctrl-C; SIGTERM for the
others), SIGKILL after its grace.

With a planner (``Plan.scaling``) the engine servers are slots: those the plan starts with
come up as above, the others wait in ``standby``; the planner part starts once the dispatcher
is ready (its fleet file written first, with the load time the stack's servers just took). Once
the stack is ready the supervisor follows the plans (``local/follower.py``): every poll it hands
the plans and heartbeats read since to the ``Follower``, which starts servers in a role
(``loading``, then ``ready`` once their probe answers, watched and restarted as any part), takes
servers out of the dispatcher's inventory (``draining``) and stops the drained ones
(``stopping``, then ``standby``: SIGTERM, SIGKILL after the part's grace, without holding up the
loop). The dispatcher's inventory lists each server it drives with the role it was started in
(``local/scaling.py``'s ``write_engines``); the server's command line is the same in either role (with
``--kv-connector`` its connector acts as either side: ``local/plan.py``).

Every change is written to ``state.json``. Run it as ``python -m local DIR [LOCK_FD]``
(``tokenfleet up`` does, detached) or in-process (``tokenfleet up --foreground``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from infra.files import write_atomic
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from local.follower import Follower, PlanFeed, engine_busy
from local.plan import PartSpec, Plan
from local.scaling import Scaling, fleet_yaml, write_engines
from local.state import (
    MARKER_ENV,
    SUPERVISOR_LOG,
    PartState,
    StackState,
    group_members,
    signal_group,
    start_time,
    stop_groups,
    write_state,
)
from schemas.events import Role
from worker.ready import child_restarts

STOP_ORDER = ("planner", "gateway", "dispatcher", "worker", "vllm", "emulated", "broker")
FOLLOWED = ("standby", "draining", "stopping")  # a server slot's states that are the follower's
POLL_S = 0.25
BACKOFF_MAX_S = 30.0
RESET_AFTER_S = 60.0


def probe(url: str, timeout_s: float = 1.0) -> bool:
    """``http://...``: answers 200; ``tcp://host:port``: accepts a connection; "": no probe (a
    part that runs is ready)."""
    if not url:
        return True
    if url.startswith("tcp://"):
        host, _, port = url.removeprefix("tcp://").rpartition(":")
        with socket.socket() as sock:
            sock.settimeout(timeout_s)
            return sock.connect_ex((host, int(port))) == 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


class _Part:
    def __init__(self, spec: PartSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None
        self.launched = 0.0
        self.failures = 0
        self.next_start = 0.0
        self.child_restarts_before = 0  # by the part's earlier processes
        self.child_restarts_now = 0  # by its current process
        self.ready_s: float | None = None  # launch -> ready, the last time it started
        self.kill_at = 0.0  # stopping (a drained server): SIGKILL from then on


class Supervisor:
    """Start, watch and stop the parts of ``plan``; ``on_ready`` is called once all are ready."""

    def __init__(
        self,
        plan: Plan,
        on_ready: Callable[[StackState], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.dir = Path(plan.dir)
        self.on_ready = on_ready
        self.say = say or (lambda line: print(time.strftime("%H:%M:%S ") + line, flush=True))
        self.parts = {spec.name: _Part(spec) for spec in plan.parts}
        self.stopping = False
        scaling = plan.scaling
        self.follower = (
            None
            if scaling is None
            else Follower(scaling, _Slots(self, scaling), self.say, kv_connector=bool(plan.kv_connector))
        )
        self.feed: PlanFeed | None = None
        self.started_wall = time.time()  # the plans are read from then on
        self.state = StackState(
            dir=plan.dir,
            mode=plan.mode,
            phase="starting",
            supervisor_pid=os.getpid(),
            supervisor_start=start_time(os.getpid()),
            bootstrap=plan.bootstrap,
            gateway_url=plan.gateway_url,
            model=plan.model,
            api_key_file=plan.api_key_file,
            clickhouse=plan.clickhouse,
            data_dir=plan.data_dir,
            policy=plan.policy,
            parts=[
                PartState(s.name, s.kind, s.address, s.probe, s.log, state=_first_state(s, scaling))
                for s in plan.parts
            ]
            + [
                PartState(i, "engine", url, url.rstrip("/") + "/health", "", state="external")
                for i, url in plan.engines
            ],
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True  # only a flag: the loops see it within POLL_S

    def run(self) -> int:
        """Start, watch until a signal, stop; 0 after a clean stop, 1 if the start failed."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        marker = os.environ.get(MARKER_ENV)
        os.environ[MARKER_ENV] = self.plan.dir  # inherited by every part (and what they start)
        ok = False
        try:
            write_state(self.dir, self.state)
            try:
                ok = self._start_all()
            except Exception as exc:
                self.state.error = f"the supervisor failed: {exc!r}; its log: {self.dir / SUPERVISOR_LOG}"
                raise
            if ok:
                self.state.phase = "ready"
                write_state(self.dir, self.state)
                self.say("stack ready")
                if self.on_ready is not None:
                    self.on_ready(self.state)
                self._watch()
        finally:
            if self.feed is not None:
                self.feed.close()
            self.state.phase = "stopping"
            write_state(self.dir, self.state)
            self._stop_all()
            self.state.phase = "stopped" if ok else "failed"
            write_state(self.dir, self.state)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if marker is None:
                os.environ.pop(MARKER_ENV, None)
            else:
                os.environ[MARKER_ENV] = marker
        return 0 if ok else 1

    # -- start ----------------------------------------------------------------------------------

    def _start_all(self) -> bool:
        deadline = time.monotonic() + self.plan.timeout_s
        while not self.stopping:
            for part in self.parts.values():
                needs = [self.state.part(name).state == "ready" for name in part.spec.after]
                if part.process is None and all(needs) and not self._standby(part):
                    try:
                        self._launch(part)
                    except OSError as exc:
                        return self._fail(part, f"could not be started: {exc}")
            for part in self.parts.values():
                if part.process is None or self.state.part(part.spec.name).state == "ready":
                    continue
                code = part.process.poll()
                if code is not None:
                    return self._fail(part, f"exited with code {code}")
                if self._ready(part):
                    part.ready_s = time.monotonic() - part.launched
                    self._mark(part, "ready", f"ready in {part.ready_s:.0f} s")
            if all(
                self.state.part(p.spec.name).state == "ready" or self._standby(p) for p in self.parts.values()
            ):
                return True
            if time.monotonic() > deadline:
                waiting = [
                    p
                    for p in self.parts.values()
                    if self.state.part(p.spec.name).state != "ready" and not self._standby(p)
                ]
                started = [p for p in waiting if p.process is not None]  # the one the others wait for
                return self._fail(
                    (started or waiting)[0], f"was not ready within {self.plan.timeout_s:.0f} s"
                )
            time.sleep(POLL_S)
        self.state.error = "interrupted while starting"
        return False

    def _fail(self, part: _Part, what: str) -> bool:
        self._mark(part, "failed", what)
        self.state.error = f"{part.spec.name} {what}; its log: {part.spec.log}"
        self.say(self.state.error)
        return False

    def _standby(self, part: _Part) -> bool:
        """A server slot waiting for a plan (not started, not waited for)."""
        return part.process is None and self.state.part(part.spec.name).state == "standby"

    def _launch(self, part: _Part, state: str = "starting", detail: str = "") -> None:
        spec = part.spec
        if spec.kind == "planner" and self.plan.scaling is not None:
            self._write_fleet(self.plan.scaling)
        env = {k: v for k, v in os.environ.items() if k not in spec.drop_env}
        env.update(spec.env)
        with open(spec.log, "ab") as log:  # the child holds its own copy
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} tokenfleet up starts {spec.name}\n".encode())
            log.flush()
            part.process = subprocess.Popen(
                spec.argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a signal reaches what it spawns
            )
        part.launched = time.monotonic()
        part.child_restarts_before += part.child_restarts_now
        part.child_restarts_now = 0
        entry = self.state.part(spec.name)
        entry.pid, entry.start_time = part.process.pid, start_time(part.process.pid)
        self._mark(part, state, f"{detail}pid {part.process.pid}")

    def _write_fleet(self, scaling: Scaling) -> None:
        """The planner's fleet file, with the load time the stack's servers took (the slowest)."""
        timed = [p.ready_s for p in self.parts.values() if p.spec.name in scaling.servers and p.ready_s]
        load_s = max(timed) if timed else scaling.load_s
        write_atomic(Path(scaling.fleet_file), fleet_yaml(scaling, load_s))

    def _ready(self, part: _Part) -> bool:
        if not probe(part.spec.probe):
            return False
        if part.spec.kind == "broker":  # a new (or restarted) embedded broker has no topics
            from infra.kafka.broker import ensure_topics
            from infra.kafka.connection import KafkaConnection

            try:
                ensure_topics(
                    KafkaConnection.plaintext(self.plan.bootstrap), self.plan.partitions, timeout_s=10
                )
            except Exception as exc:  # KafkaError, OSError: not ready yet, asked again next poll
                self.say(f"{part.spec.name}: topics not created yet ({type(exc).__name__})")
                return False
        return True

    def _mark(self, part: _Part, state: str, detail: str = "") -> None:
        entry = self.state.part(part.spec.name)
        entry.state, entry.detail = state, detail
        write_state(self.dir, self.state)
        self.say(f"{part.spec.name}: {state}" + (f" ({detail})" if detail else ""))

    # -- watch ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        if self.follower is not None:
            self.feed = PlanFeed(self._connection(), self.started_wall)
            self.feed.start()
        while not self.stopping:
            now = time.monotonic()
            if self.follower is not None and self.feed is not None:
                for event in self.feed.take():
                    self.follower.observe(event)
                self.follower.step(time.time())
            for part in self.parts.values():
                entry = self.state.part(part.spec.name)
                if entry.state in FOLLOWED:
                    continue  # a server slot the follower starts and stops
                assert part.process is not None
                self._count_child_restarts(part)
                if entry.state == "loading":  # a server the follower started
                    code = part.process.poll()
                    if code is not None:
                        part.failures += 1
                        delay = min(BACKOFF_MAX_S, 2.0 ** (part.failures - 1))
                        part.next_start = now + delay
                        self._mark(part, "exited", f"code {code} while loading; restart in {delay:.0f} s")
                    elif self._ready(part):
                        part.ready_s = now - part.launched
                        self._mark(part, "ready", f"ready in {part.ready_s:.0f} s")
                    elif now - part.launched > self.plan.timeout_s:
                        stop_groups([part.process.pid], signal.SIGKILL, 0)  # seen as exited next
                elif entry.state in ("ready", "restarting"):
                    code = part.process.poll()
                    if code is not None:
                        ran = now - part.launched
                        part.failures = 1 if ran >= RESET_AFTER_S else part.failures + 1
                        delay = min(BACKOFF_MAX_S, 2.0 ** (part.failures - 1))
                        part.next_start = now + delay
                        self._mark(part, "exited", f"code {code} after {ran:.0f} s; restart in {delay:.0f} s")
                    elif entry.state == "restarting":
                        if self._ready(part):
                            self._mark(part, "ready", f"back in {now - part.launched:.0f} s")
                        elif now - part.launched > self.plan.timeout_s:
                            stop_groups([part.process.pid], signal.SIGKILL, 0)  # seen as exited next
                elif entry.state == "exited" and now >= part.next_start:
                    stop_groups([part.process.pid], signal.SIGKILL, 0)  # what it spawned goes too
                    entry.restarts += 1
                    try:
                        self._launch(part, "restarting", f"restart {entry.restarts}, ")
                    except OSError as exc:  # tried again after the next back-off
                        part.failures += 1
                        part.next_start = now + min(BACKOFF_MAX_S, 2.0 ** (part.failures - 1))
                        self._mark(part, "exited", f"could not be started: {exc}")
                        continue
            time.sleep(POLL_S)

    def _connection(self) -> KafkaConnection:
        """The broker's connection as the parts' settings describe it (TLS, SASL), to the stack's."""
        return KafkaConnection.from_settings(Settings(), bootstrap=self.plan.bootstrap)

    def _count_child_restarts(self, part: _Part) -> None:
        """The restarts the part made of its own child, as its ``restarts_file`` says now."""
        if not part.spec.restarts_file or part.process is None:
            return
        seen = child_restarts(Path(part.spec.restarts_file), part.process.pid)
        if seen is not None and seen != part.child_restarts_now:
            part.child_restarts_now = seen
            self.state.part(part.spec.name).child_restarts = part.child_restarts_before + seen
            write_state(self.dir, self.state)

    # -- stop -----------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        for kind in STOP_ORDER:
            parts = [
                p
                for p in self.parts.values()
                if p.spec.kind == kind
                and p.process is not None
                and self.state.part(p.spec.name).state != "standby"
            ]  # (a standby server's process and group are gone: its group id may be another's now)
            if not parts:
                continue
            by_signal: dict[int, list[_Part]] = {}
            for part in parts:
                by_signal.setdefault(part.spec.stop_signal, []).append(part)
            for signum, group in by_signal.items():
                grace = max(p.spec.stop_grace_s for p in group)
                stop_groups([p.process.pid for p in group if p.process is not None], signum, grace)
            for part in parts:
                assert part.process is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    part.process.wait(timeout=5)
                entry = self.state.part(part.spec.name)
                if entry.state != "failed":
                    entry.state = "stopped"
                entry.detail = f"exit {part.process.returncode}"
                left = group_members(part.process.pid)
                if left:
                    entry.detail += f"; left running: {left}"
                elif part.spec.scratch:
                    shutil.rmtree(part.spec.scratch, ignore_errors=True)
                write_state(self.dir, self.state)
                self.say(f"{part.spec.name}: stopped ({entry.detail})")


def _first_state(spec: PartSpec, scaling: Scaling | None) -> str:
    """``standby`` for a server slot that does not start with the stack, else ``waiting``."""
    waits = scaling is not None and spec.name in scaling.servers[scaling.initial :]
    return "standby" if waits else "waiting"


class _Slots:
    """The supervisor's side of ``local.follower.Servers``: the server slots as its parts."""

    def __init__(self, supervisor: Supervisor, scaling: Scaling) -> None:
        self.supervisor = supervisor
        self.scaling = scaling

    def _part(self, name: str) -> _Part:
        return self.supervisor.parts[name]

    def state(self, name: str) -> str:
        return self.supervisor.state.part(name).state

    def start(self, name: str, role: Role) -> None:
        part = self._part(name)
        part.failures = 0
        try:
            self.supervisor._launch(part, "loading", f"{role}, ")
        except OSError as exc:  # tried again at the next step
            self.supervisor._mark(part, "standby", f"could not be started: {exc}")

    def mark(self, name: str, state: str, detail: str) -> None:
        if state == "standby":  # its process and group are gone: no pid to show or to stop
            entry = self.supervisor.state.part(name)
            entry.pid = entry.start_time = None
        self.supervisor._mark(self._part(name), state, detail)

    def stop(self, name: str) -> None:
        part = self._part(name)
        assert part.process is not None
        signal_group(part.process.pid, part.spec.stop_signal)
        part.kill_at = time.monotonic() + part.spec.stop_grace_s
        self.supervisor._mark(part, "stopping", f"signal {part.spec.stop_signal} sent")

    def gone(self, name: str) -> bool:
        part = self._part(name)
        if part.process is None:
            return True
        if part.process.poll() is None or group_members(part.process.pid):
            if self.state(name) == "stopping" and time.monotonic() > part.kill_at:
                signal_group(part.process.pid, signal.SIGKILL)
            return False
        return True

    def busy(self, name: str) -> bool:
        metrics = self._part(name).spec.probe.removesuffix("/health") + "/metrics"
        return engine_busy(metrics, self.scaling.model)

    def publish(self, active: Mapping[str, Role]) -> None:
        write_engines(self.scaling, active)
        listed = ", ".join(name if role == "both" else f"{name} ({role})" for name, role in active.items())
        self.supervisor.say(f"dispatcher's engines: {listed}")


def main(argv: list[str]) -> int:
    """``python -m local DIR [LOCK_FD]``: supervise the plan in DIR (holding the lock fd)."""
    directory = Path(argv[0]).resolve()
    plan = Plan.from_json((directory / "plan.json").read_text())
    lock: IO[bytes] | None = os.fdopen(int(argv[1]), "rb") if len(argv) > 1 else None
    try:
        return Supervisor(plan).run()
    finally:
        if lock is not None:
            lock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
