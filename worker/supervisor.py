"""``tokenfleet worker``: a supervisor that runs the worker the bootstrap (``infra/bootstrap.py``)
wires in a child process, and starts it again when it dies or stops consuming.

Why a child process: a Faust worker whose broker went away and came back does not recover by
itself (a restarted embedded Tansu has lost its log: topics, committed offsets, consumer groups;
the worker stayed up in a "Heartbeat session expired" loop). A fresh process is the one state
that is known to work, so:

- the supervisor (``run_worker``) recreates missing topics (``ensure_topics``, bounded retries),
  starts the child, and when the child exits abnormally starts it again after a bounded,
  jittered back-off (reset once a child has run ``Backoff.reset_after_s``). SIGTERM / SIGINT:
  the child is stopped gracefully (SIGTERM, then SIGKILL after ``Backoff.stop_timeout_s``) and
  the supervisor exits without a restart. A child killed with the supervisor: the child asks
  the kernel for SIGKILL when its parent dies (Linux) and checks its parent every probe.
- the child runs a watchdog (``Watchdog``) that exits the process with ``WATCHDOG_EXIT`` when
  it is no longer really consuming: the broker lost its log (a high watermark went down, or
  topics the worker reads are gone), the broker did not answer for ``broker_down_s``, the
  request lane's fetches were not answered for ``fetch_stale_s``, or Faust's consumer or the
  lane had no partitions for ``unassigned_s``.

The readiness marker (``ready_file``) exists while a child is ready. It names the child's pid,
the supervisor's pid, the run token (``RUN_TOKEN_ENV``, set by whoever started the supervisor)
and the start number; the supervisor removes it before every (re)start, so a marker is trusted
only if it names a live child of this run (``WorkerProcess.wait_ready``).

In embedded mode (no ClickHouse server configured) the child owns the ClickHouse data
directory: the engine locks it, so readers query through it or after it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import faust

from infra.bootstrap import build_worker_app, kafka_bootstrap
from infra.errors import first_line
from infra.kafka.broker import BrokerProbe, ensure_topics
from infra.settings import Settings
from schemas.topics import ALL_TOPICS

log = logging.getLogger(__name__)

WATCHDOG_EXIT = 75  # EX_TEMPFAIL: the child stopped itself, not consuming any more; restart it
RUN_TOKEN_ENV = "TOKENFLEET_WORKER_RUN_TOKEN"  # names this run in the ready marker
_CHILD_ENV = "_TOKENFLEET_WORKER_CHILD"  # the child's settings and identity (JSON); internal
_POLL_S = 0.1
_LOG_LOST = " (the broker lost its log)"
_AT_ONCE = ")"  # reasons in parentheses: exit at once (nothing to commit, nobody to answer)


@dataclass(frozen=True, slots=True)
class WatchdogLimits:
    """When the child gives up on itself (seconds)."""

    probe_s: float = 0.5  # how often it looks
    broker_down_s: float = 10.0  # the broker answers no metadata request
    fetch_stale_s: float = 5.0  # the lane reads partitions but no fetch of its was answered
    unassigned_s: float = 20.0  # Faust's consumer or the lane has no partitions
    missing_topics_probes: int = 2  # topics it reads absent on this many probes in a row
    stop_grace_s: float = 8.0  # graceful stop, then the process exits anyway
    # The watchdog's own connection to the broker broke: the broker process went away. With an
    # in-memory broker (the embedded Tansu) its log went with it; exit at once. Against a
    # durable Kafka cluster this restarts the worker on every restart of that one broker.
    exit_on_disconnect: bool = True


@dataclass(frozen=True, slots=True)
class Backoff:
    """The supervisor's restart policy (seconds)."""

    initial_s: float = 0.5  # first restart after 0.25-0.5 s, doubling up to max_s (jittered)
    max_s: float = 30.0
    reset_after_s: float = 60.0  # a child that ran this long starts the count again
    start_timeout_s: float = 180.0  # a child not ready by then is killed and restarted
    stop_timeout_s: float = 25.0  # SIGTERM to the child, then SIGKILL
    ensure_topics_s: float = 10.0  # retry budget of one ensure_topics before a (re)start

    def delay(self, failures: int) -> float:
        ceiling = min(self.max_s, self.initial_s * 2.0 ** max(0, failures - 1))
        return ceiling * random.uniform(0.5, 1.0)


def run_worker(
    settings: Settings,
    loglevel: str = "warn",
    backoff: Backoff | None = None,
    limits: WatchdogLimits | None = None,
) -> None:
    """Supervise worker children until SIGINT / SIGTERM."""
    with kafka_bootstrap(settings) as bootstrap:
        limits = limits or WatchdogLimits(exit_on_disconnect=settings.watchdog_exit_on_disconnect)
        _Supervisor(settings, bootstrap, loglevel, backoff or Backoff(), limits).run()


class _Supervisor:
    def __init__(
        self, settings: Settings, bootstrap: str, loglevel: str, backoff: Backoff, limits: WatchdogLimits
    ) -> None:
        self.settings = settings.model_copy(update={"kafka_bootstrap": bootstrap})
        self.bootstrap, self.loglevel = bootstrap, loglevel
        self.backoff, self.limits = backoff, limits
        self.marker = ready_marker(settings)
        self.run_token = os.environ.get(RUN_TOKEN_ENV) or uuid.uuid4().hex
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only flags and a signal to the child here: no locks, no I/O that could re-enter.
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> None:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        failures, start = 0, 0
        try:
            while not self.stopping:
                self.marker.unlink(missing_ok=True)
                try:
                    ensure_topics(
                        self.bootstrap, self.settings.topic_partitions, timeout_s=self.backoff.ensure_topics_s
                    )
                except Exception as exc:  # KafkaError, OSError: the broker does not answer yet
                    failures += 1
                    delay = self.backoff.delay(failures)
                    log.warning(
                        "worker supervisor: kafka %s not usable (%s); next try in %.1f s",
                        self.bootstrap, first_line(exc), delay,
                    )  # fmt: skip
                    self._sleep(delay)
                    continue
                if self.stopping:
                    break
                start += 1
                began = time.monotonic()
                code = self._run_child(start)
                self.marker.unlink(missing_ok=True)
                if self.stopping:
                    break
                if code == 0:
                    log.warning("worker supervisor: the worker (start %d) stopped on its own; exiting", start)
                    break
                failures = 1 if time.monotonic() - began >= self.backoff.reset_after_s else failures + 1
                delay = self.backoff.delay(failures)
                log.warning(
                    "worker supervisor: the worker (start %d) exited with %s after %.1f s; "
                    "restarting in %.1f s",
                    start, _describe(code), time.monotonic() - began, delay,
                )  # fmt: skip
                self._sleep(delay)
        finally:
            if self.child is not None and self.child.poll() is None:
                self.child.kill()
                self.child.wait()
            self.marker.unlink(missing_ok=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_child(self, start: int) -> int:
        identity = {"run": self.run_token, "start": start, "supervisor": os.getpid()}
        env = {
            **os.environ,
            _CHILD_ENV: json.dumps(
                {
                    "settings": self.settings.model_dump(mode="json"),
                    "identity": identity,
                    "limits": asdict(self.limits),
                    "loglevel": self.loglevel,
                }
            ),
        }
        self.child = child = subprocess.Popen([sys.executable, "-m", "worker.supervisor"], env=env)
        if self.stopping:  # a signal came while starting it
            child.send_signal(signal.SIGTERM)
        began, term_sent_at = time.monotonic(), None
        while (code := child.poll()) is None:
            now = time.monotonic()
            if self.stopping and term_sent_at is None:
                term_sent_at = now
            if term_sent_at is not None and now - term_sent_at > self.backoff.stop_timeout_s:
                log.warning("worker supervisor: the worker did not stop in time; killing it")
                child.kill()
            if (
                term_sent_at is None
                and now - began > self.backoff.start_timeout_s
                and not self.marker.exists()
                and not self.stopping
            ):
                log.warning(
                    "worker supervisor: the worker was not ready within %.0f s; killing it",
                    self.backoff.start_timeout_s,
                )
                child.kill()
                term_sent_at = now
            time.sleep(_POLL_S)
        return code

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))


def _describe(code: int) -> str:
    if code == WATCHDOG_EXIT:
        return f"code {code} (its watchdog: not consuming)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


# --- the child -----------------------------------------------------------------------------


def _child_main() -> int:
    spec = json.loads(os.environ.pop(_CHILD_ENV))
    identity: dict[str, Any] = spec["identity"]
    _die_with_parent(int(identity["supervisor"]))
    settings = Settings.model_validate(spec["settings"])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_child(settings, identity, WatchdogLimits(**spec["limits"]), spec["loglevel"])


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the supervisor dies (Linux ``PR_SET_PDEATHSIG``); exit if it already has."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        raise SystemExit("worker: the supervisor is gone")


def run_child(settings: Settings, identity: dict[str, Any], limits: WatchdogLimits, loglevel: str) -> int:
    """One worker process: run until stopped; the exit status (``WATCHDOG_EXIT``: gave up)."""
    bootstrap = settings.kafka_bootstrap
    feedback = settings.clickhouse_dsn != "off"
    app, store = build_worker_app(settings, bootstrap, feedback=feedback)
    log.warning(
        "worker %s (start %s): kafka %s, clickhouse %s, policy %s, "
        "metrics http://127.0.0.1:%s/metrics (pid %s)",
        settings.app_id,
        identity["start"],
        bootstrap,
        settings.clickhouse_url if feedback else "off",
        settings.policy,
        app.conf.web_port,
        os.getpid(),
    )
    worker = ReadyMarkingWorker(app, loglevel=loglevel, quiet=True)
    worker.ready_file = ready_marker(settings)
    worker.identity = identity
    worker.store = store
    worker.watchdog = Watchdog(app, bootstrap, limits, int(identity["supervisor"]), worker.give_up)
    worker.ready_file.unlink(missing_ok=True)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        _unlink_own(worker.ready_file)
        if store is not None:
            store.close()
    return worker.exit_code or code


class ReadyMarkingWorker(faust.Worker):
    """A Faust worker that writes ``ready_file`` once partitions are assigned and tables recovered,
    then starts its watchdog.

    It also moves everything alive at that point (~100 000 objects: modules, Faust, aiokafka,
    pydantic schemas) out of the garbage collector's reach with ``gc.freeze()``. Routing
    allocates fast, so full collections come every few seconds, and each one walked all of that
    while every request in the worker waited: measured in a 3-run benchmark on a busy 2-core
    machine, 32 full collections of 35-270 ms (3.6 s in all) before, 2-130 ms (1.1 s) after.
    """

    ready_file: Path
    identity: dict[str, Any]
    watchdog: Watchdog | None = None
    store: Any = None  # the feedback store, closed before a fast exit
    exit_code: int = 0

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # Faust's terminal spinner sets the root logger to DEBUG so that it spins on every
        # record: then every debug call in aiokafka and Faust builds a LogRecord (4 % of the
        # worker's CPU while routing). A service needs no spinner; keep the level asked for.
        self.spinner = None
        super().on_setup_root_logger(logger, level)

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        gc.collect()
        gc.freeze()
        log.info("worker ready; %d objects frozen out of garbage collection", gc.get_freeze_count())
        write_marker(
            self.ready_file, {**getattr(self, "identity", {}), "pid": os.getpid(), "ts": time.time()}
        )
        if self.watchdog is not None:
            self.add_future(self.watchdog.run())

    def give_up(self, reason: str, graceful: bool = True) -> None:
        """Not consuming any more: no longer ready; stop (gracefully, within the grace) and exit
        with ``WATCHDOG_EXIT``. Not ``graceful`` (the broker lost its log, so there is nothing to
        commit or leave; a graceful stop would first rejoin the new broker's group, ~4 s): close
        the feedback store and exit at once."""
        if self.exit_code:
            return
        log.error("worker watchdog: %s; exiting (code %d) to be restarted", reason, WATCHDOG_EXIT)
        self.exit_code = WATCHDOG_EXIT
        _unlink_own(self.ready_file)
        if not graceful:
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.close()
            logging.shutdown()
            os._exit(WATCHDOG_EXIT)
        grace = self.watchdog.limits.stop_grace_s if self.watchdog is not None else 5.0
        timer = threading.Timer(grace, _hard_exit, (self.ready_file,))
        timer.daemon = True
        timer.start()
        os.kill(os.getpid(), signal.SIGTERM)  # Faust's own graceful shutdown


def _hard_exit(marker: Path) -> None:
    log.error("worker watchdog: the graceful stop took too long; exiting now")
    _unlink_own(marker)
    logging.shutdown()
    os._exit(WATCHDOG_EXIT)


class Watchdog:
    """Looks every ``limits.probe_s`` whether the worker still really consumes (see the module
    docstring); calls ``give_up(reason)`` once when not."""

    def __init__(
        self,
        app: faust.App,
        bootstrap: str,
        limits: WatchdogLimits,
        supervisor_pid: int,
        give_up: Callable[[str, bool], None],
    ) -> None:
        self.app, self.limits, self.supervisor_pid, self.give_up = app, limits, supervisor_pid, give_up
        self.probe = BrokerProbe(
            bootstrap,
            timeout_s=min(2.0, limits.broker_down_s),
            on_lost=self._lost if limits.exit_on_disconnect else None,
        )
        self._highest: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self._missing_probes = 0

    def _lost(self, what: str) -> None:
        # At once, before this process's consumer can rejoin a restarted broker's group: a
        # member that dies in the middle of a join stays in the group until its session times
        # out, and the next worker's join then takes a second round (measured: +8 s).
        self.give_up(f"{what} (the broker went away)", False)

    async def run(self) -> None:
        required = {spec.name for spec in ALL_TOPICS}
        with contextlib.suppress(Exception):
            required |= {table.changelog_topic.get_topic_name() for table in self.app.tables.values()}
        try:
            while True:
                await asyncio.sleep(self.limits.probe_s)
                try:
                    verdict = await self.check(required)
                except Exception:  # a fault of the watchdog's own must not stop a working worker
                    log.exception("worker watchdog: the check failed; looking again")
                    await asyncio.sleep(5.0)
                    continue
                if verdict is not None:
                    self.give_up(*verdict)
                    return
        finally:
            await self.probe.close()

    async def check(self, required: set[str]) -> tuple[str, bool] | None:
        """The reason to give up and whether to stop gracefully, or ``None``."""
        reason = await self._reason(required)
        if reason is None:
            return None
        return reason, not reason.endswith(_AT_ONCE)

    async def _reason(self, required: set[str]) -> str | None:
        if os.getppid() != self.supervisor_pid:
            return "the worker's supervisor is gone (orphaned)"
        limits, now = self.limits, time.monotonic()
        topics = await self.probe.topics()
        if self._lasted("broker down", topics is None, now) > limits.broker_down_s:
            return f"the broker did not answer for {limits.broker_down_s:.0f} s"
        if topics is not None:
            missing = sorted(required - topics)
            self._missing_probes = self._missing_probes + 1 if missing else 0
            if self._missing_probes >= limits.missing_topics_probes:
                return f"topics {missing} are gone from the broker{_LOG_LOST}"
        health: Callable[[float], tuple[bool, dict[str, Any]]] = self.app.conf.tokenfleet_health
        consuming, status = health(limits.fetch_stale_s)
        for name, mark in status["highwater"].items():
            if mark < self._highest.get(name, 0):
                return f"{name}'s high watermark went from {self._highest[name]} to {mark}{_LOG_LOST}"
            self._highest[name] = mark
        unassigned = not status["assigned"] or not status["lane_partitions"]
        if self._lasted("unassigned", unassigned, now) > limits.unassigned_s:
            return f"no partitions assigned for {limits.unassigned_s:.0f} s"
        if self._lasted("stale", not unassigned and not consuming, now) > limits.fetch_stale_s:
            return f"the request lane's fetches were not answered for {limits.fetch_stale_s:.0f} s"
        return None

    def _lasted(self, what: str, bad: bool, now: float) -> float:
        """How long ``bad`` has held (0 while it does not)."""
        if not bad:
            self._since.pop(what, None)
            return 0.0
        return now - self._since.setdefault(what, now)


def ready_marker(settings: Settings) -> Path:
    """A file that exists while a worker is ready (consuming, tables recovered)."""
    return ready_file(settings.data_dir, settings.app_id)


def ready_file(data_dir: Path, app_id: str) -> Path:
    return data_dir / f"{app_id}.worker.ready"


def write_marker(path: Path, content: dict[str, Any]) -> None:
    """Write the marker whole (a reader never sees half of it)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(content) + "\n")
    os.replace(partial, path)


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker's content, or ``None`` (absent, or not written by this version)."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def _unlink_own(path: Path) -> None:
    """Remove the marker if this process wrote it (a successor's is not ours)."""
    content = read_marker(path)
    if content is not None and content.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_child_main())
