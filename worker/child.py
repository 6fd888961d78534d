"""One worker process, started by the supervisor (``python -m worker.child``): the worker
``worker/wiring.py`` wires (``WorkerRuntime``), its watchdog and its ready marker.

The supervisor hands the child its settings, identity, watchdog limits and log level as one
JSON document on the child's standard input (``ChildSpec``), never in the environment: the
environment is the user's, read once by ``Settings``. In embedded mode (no ClickHouse server
configured) the child owns the ClickHouse data directory: the engine locks it, so readers query
through it or after it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faust

from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from worker.probes import HEALTH_MAX_AGE_S
from worker.ready import ready_marker, unlink_own, write_marker
from worker.watchdog import WATCHDOG_EXIT, Watchdog, WatchdogLimits
from worker.wiring import WorkerRuntime, build_worker

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What the supervisor tells a child: who it is and how to run."""

    settings: Settings
    identity: dict[str, Any]  # run token, start number, supervisor pid
    limits: WatchdogLimits
    loglevel: str

    def dumps(self) -> str:
        return json.dumps(
            {
                "settings": self._settings_with_secrets(),
                "identity": self.identity,
                "limits": asdict(self.limits),
                "loglevel": self.loglevel,
            }
        )

    def _settings_with_secrets(self) -> dict[str, Any]:
        """The settings as JSON, secrets in the clear: ``model_dump`` masks a ``SecretStr``
        (``**********``), and the child needs the password itself. The document goes to the
        child's standard input only (never the environment, the command line or a log)."""
        settings = self.settings.model_dump(mode="json")
        settings["kafka_sasl_password"] = self.settings.kafka_sasl_password.get_secret_value()
        return settings

    @classmethod
    def loads(cls, text: str) -> ChildSpec:
        spec = json.loads(text)
        return cls(
            Settings.model_validate(spec["settings"]),
            spec["identity"],
            WatchdogLimits(**spec["limits"]),
            spec["loglevel"],
        )


def main() -> int:
    spec = ChildSpec.loads(sys.stdin.read())
    _die_with_parent(int(spec.identity["supervisor"]))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_child(spec.settings, spec.identity, spec.limits, spec.loglevel)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the supervisor dies (Linux ``PR_SET_PDEATHSIG``); exit if it already has."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        raise SystemExit("worker: the supervisor is gone")


def run_child(settings: Settings, identity: dict[str, Any], limits: WatchdogLimits, loglevel: str) -> int:
    """One worker process: run until stopped; the exit status (``WATCHDOG_EXIT``: gave up)."""
    connection = KafkaConnection.from_settings(settings)
    feedback = settings.clickhouse_dsn != "off"
    runtime = build_worker(settings, connection, feedback=feedback)
    log.warning(
        "worker %s (start %s): kafka %s, clickhouse %s, policy %s, "
        "metrics http://%s:%s/metrics, /health, /ready (pid %s)",
        settings.app_id,
        identity["start"],
        connection,
        settings.clickhouse_url if feedback else "off",
        settings.policy,
        settings.http_host,
        runtime.app.conf.web_port,
        os.getpid(),
    )
    worker = ReadyMarkingWorker(runtime.app, loglevel=loglevel, quiet=True)
    worker.runtime = runtime
    worker.ready_file = ready_marker(settings)
    worker.identity = identity
    worker.watchdog = Watchdog(
        runtime.app, runtime.health, connection, limits, int(identity["supervisor"]), worker.give_up
    )
    worker.ready_file.unlink(missing_ok=True)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        unlink_own(worker.ready_file)
        if runtime.store is not None:
            runtime.store.close()
    return worker.exit_code or code


class ReadyMarkingWorker(faust.Worker):
    """A Faust worker that writes ``ready_file`` once it consumes (its partitions assigned, its
    readers answered), then starts its watchdog.

    It also moves everything alive at that point (~100 000 objects: modules, Faust, aiokafka,
    pydantic schemas) out of the garbage collector's reach with ``gc.freeze()``. Routing
    allocates fast, so full collections come every few seconds, and each one walked all of that
    while every request in the worker waited (``docs/results/speed.md``).
    """

    runtime: WorkerRuntime  # its health, its decision keeper, its store (closed before a fast exit)
    ready_file: Path
    identity: dict[str, Any]
    watchdog: Watchdog | None = None
    exit_code: int = 0

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # Faust's terminal spinner sets the root logger to DEBUG so that it spins on every
        # record: then every debug call in aiokafka and Faust builds a LogRecord, on every
        # request routed (docs/results/speed.md). A service needs no spinner; keep the level
        # asked for.
        self.spinner = None
        super().on_setup_root_logger(logger, level)

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        gc.collect()
        gc.freeze()
        self.add_future(self._ready_when_consuming())

    async def _ready_when_consuming(self) -> None:
        """Ready = consuming (the deciders' group gave this worker its partitions and the
        readers' fetches are answered: ``runtime.health``), not merely started: a request sent
        to a worker that says it is ready must not wait for a group join. The watchdog starts
        then too; if that takes over ``unassigned_s``, it starts anyway (and gives up on the
        worker if nothing changes)."""
        health = self.runtime.health
        limit = self.watchdog.limits.unassigned_s if self.watchdog is not None else 20.0
        deadline = time.monotonic() + limit
        while not health(HEALTH_MAX_AGE_S)[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
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
        unlink_own(self.ready_file)
        try:  # for the next process (worker/decision_memory.py)
            self.runtime.keep_decisions()
        except Exception:
            log.exception("worker watchdog: the decisions could not be kept for the next process")
        if not graceful:
            if self.runtime.store is not None:
                with contextlib.suppress(Exception):
                    self.runtime.store.close()
            logging.shutdown()
            os._exit(WATCHDOG_EXIT)
        grace = self.watchdog.limits.stop_grace_s if self.watchdog is not None else 5.0
        timer = threading.Timer(grace, _hard_exit, (self.ready_file,))
        timer.daemon = True
        timer.start()
        os.kill(os.getpid(), signal.SIGTERM)  # Faust's own graceful shutdown


def _hard_exit(marker: Path) -> None:
    log.error("worker watchdog: the graceful stop took too long; exiting now")
    unlink_own(marker)
    logging.shutdown()
    os._exit(WATCHDOG_EXIT)


if __name__ == "__main__":
    sys.exit(main())
