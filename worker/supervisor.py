"""``tokenfleet worker``: a supervisor that runs the worker ``worker/wiring.py`` wires in a child
process (``worker/child.py``), and starts it again when it dies or stops consuming (its
watchdog, ``worker/watchdog.py``, says when).

Why a child process: a Faust worker whose broker went away and came back does not recover by
itself; a fresh process is the one state that is known to work. The supervisor (``run_worker``)
waits until the broker answers, recreates missing topics (``ensure_topics``, bounded retries),
starts the child, and when the child exits abnormally starts it again after a bounded, jittered
back-off (reset once a child has run ``Backoff.reset_after_s``). A broker that does not answer
is said once, in one line; the supervisor then probes it quietly, on the same back-off, and says
once more when it answers again (``_wait_for_the_broker``). SIGTERM / SIGINT: the child is
stopped gracefully (SIGTERM, then SIGKILL after ``Backoff.stop_timeout_s``) and the supervisor
exits without a restart. A child killed with the supervisor: the child asks the kernel for
SIGKILL when its parent dies (Linux) and checks its parent every probe. The ready marker
(``worker/ready.py``) is removed before every (re)start; each child's marker carries its start
number, which is how the child's restarts are seen from outside (``tokenfleet status``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from types import FrameType

from infra.errors import first_line
from infra.kafka.broker import (
    AnotherScheduler,
    deciders_group,
    ensure_topics,
    other_schedulers,
    why_unreachable,
)
from infra.kafka.bus import kafka_connection
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from worker.child import ChildSpec
from worker.ready import ready_marker
from worker.watchdog import WATCHDOG_EXIT, WatchdogLimits

log = logging.getLogger(__name__)

_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Backoff:
    """The supervisor's restart policy (seconds)."""

    initial_s: float = 0.5  # first restart after 0.25-0.5 s, doubling up to max_s (jittered)
    max_s: float = 30.0
    reset_after_s: float = 60.0  # a child that ran this long starts the count again
    start_timeout_s: float = 180.0  # a child not ready by then is killed and restarted
    stop_timeout_s: float = 25.0  # SIGTERM to the child, then SIGKILL
    ensure_topics_s: float = 10.0  # retry budget of one ensure_topics before a (re)start
    probe_timeout_s: float = 3.0  # one probe of a broker that does not answer waits this long

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
    with kafka_connection(settings) as connection:
        limits = limits or WatchdogLimits(exit_on_disconnect=settings.watchdog_exit_on_disconnect)
        _Supervisor(settings, connection, loglevel, backoff or Backoff(), limits).run()


class _Supervisor:
    def __init__(
        self,
        settings: Settings,
        connection: KafkaConnection,
        loglevel: str,
        backoff: Backoff,
        limits: WatchdogLimits,
    ) -> None:
        # The child builds the same connection from these settings (the embedded broker's address in).
        self.settings = settings.model_copy(update={"kafka_bootstrap": connection.bootstrap})
        self.connection, self.loglevel = connection, loglevel
        self.backoff, self.limits = backoff, limits
        self.marker = ready_marker(settings)
        self.run_token = settings.worker_run_token or uuid.uuid4().hex
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
                if not self._wait_for_the_broker():
                    break
                try:
                    ensure_topics(
                        self.connection,
                        self.settings.topic_partitions,
                        timeout_s=self.backoff.ensure_topics_s,
                    )
                except Exception as exc:  # KafkaError, OSError: the broker answers, but not enough yet
                    failures += 1
                    delay = self.backoff.delay(failures)
                    log.warning(
                        "worker supervisor: kafka %s not usable (%s); next try in %.1f s",
                        self.connection, first_line(exc), delay,
                    )  # fmt: skip
                    self._sleep(delay)
                    continue
                if self.stopping:
                    break
                if start == 0 and self.settings.refuse_other_schedulers:
                    self._refuse_a_second_scheduler()
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

    def _wait_for_the_broker(self) -> bool:
        """Return ``True`` once a broker of the connection answers, ``False`` when told to stop
        first. A broker that does not answer is said in one line; it is then probed quietly
        (``why_unreachable``: no client retries, no log lines), the probes ``Backoff.delay``
        apart (doubling up to ``Backoff.max_s``, jittered), and one more line says when it
        answers again. ``BrokerRefused`` (one line) if it refuses this worker's TLS or SASL:
        waiting for a broker that is coming up makes sense, retrying a certificate nobody
        trusts or a wrong password does not (and would hide the reason in a restart loop)."""
        down_since: float | None = None
        tries = 0
        while not self.stopping:
            why = why_unreachable(self.connection, self.backoff.probe_timeout_s)
            if why is None:
                if down_since is not None:
                    log.warning(
                        "worker supervisor: Kafka broker %s answers again (unreachable for %.0f s)",
                        self.connection, time.monotonic() - down_since,
                    )  # fmt: skip
                return True
            if down_since is None:
                down_since = time.monotonic()
                log.warning(
                    "worker supervisor: Kafka broker %s unreachable (%s); retrying every %.1f s, "
                    "backing off to every %.0f s, quietly until it answers",
                    self.connection, why, self.backoff.initial_s, self.backoff.max_s,
                )  # fmt: skip
            tries += 1
            self._sleep(self.backoff.delay(tries))
        return False

    def _refuse_a_second_scheduler(self) -> None:
        """``AnotherScheduler`` (one line) if another scheduler (another app id) already decides
        the requests of these topics: two would decide every request twice."""
        own = deciders_group(self.settings.app_id)
        try:
            others = other_schedulers(self.connection, own)
        except Exception as exc:  # cannot tell (an old broker): go on, but say so
            log.warning("worker supervisor: could not list the consumer groups (%s)", first_line(exc))
            return
        if others:
            raise AnotherScheduler(
                f"another scheduler already decides the requests on {self.connection} (consumer group "
                f"{', '.join(others)}); stop it, or run this worker with its TOKENFLEET_APP_ID"
            )

    def _run_child(self, start: int) -> int:
        identity = {"run": self.run_token, "start": start, "supervisor": os.getpid()}
        spec = ChildSpec(self.settings, identity, self.limits, self.loglevel)
        self.child = child = subprocess.Popen([sys.executable, "-m", "worker.child"], stdin=subprocess.PIPE)
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # a child that died at once: its exit code tells
            child.stdin.write(spec.dumps().encode())
            child.stdin.close()
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
