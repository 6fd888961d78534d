"""The child's watchdog: it stops the worker when it is no longer really consuming, so that the
supervisor starts a fresh one.

Why: a Faust worker whose broker went away and came back does not recover by itself (a restarted
embedded Tansu has lost its log: topics, committed offsets, consumer groups; the worker stayed
up in a "Heartbeat session expired" loop). The watchdog gives up (``WATCHDOG_EXIT``) when the
broker lost its log (a high watermark went down, or topics the worker reads are gone), the
broker did not answer for ``broker_down_s``, the request lane's fetches were not answered for
``fetch_stale_s``, or the deciders' consumer group gave it no assignment for ``unassigned_s``.
Reasons that end in ``)`` mean "exit at once": nothing to commit, nobody to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import faust

from infra.kafka.broker import BrokerProbe
from infra.kafka.connection import KafkaConnection
from schemas.topics import ALL_TOPICS
from worker.probes import Health

log = logging.getLogger(__name__)

WATCHDOG_EXIT = 75  # EX_TEMPFAIL: the child stopped itself, not consuming any more; restart it
_LOG_LOST = " (the broker lost its log)"
_AT_ONCE = ")"  # reasons in parentheses: exit at once (nothing to commit, nobody to answer)


@dataclass(frozen=True, slots=True)
class WatchdogLimits:
    """When the child gives up on itself (seconds)."""

    probe_s: float = 0.5  # how often it looks
    broker_down_s: float = 10.0  # the broker answers no metadata request
    fetch_stale_s: float = 5.0  # the lane reads partitions but no fetch of its was answered
    unassigned_s: float = 20.0  # the deciders' group gave no assignment (rebalancing) this long
    missing_topics_probes: int = 2  # topics it reads absent on this many probes in a row
    stop_grace_s: float = 8.0  # graceful stop, then the process exits anyway
    # The watchdog's own connection to the broker broke: the broker process went away. With an
    # in-memory broker (the embedded Tansu) its log went with it; exit at once. Against a
    # durable Kafka cluster this restarts the worker on every restart of that one broker.
    exit_on_disconnect: bool = True


class Watchdog:
    """Looks every ``limits.probe_s`` whether the worker still really consumes (see the module
    docstring); calls ``give_up(reason, graceful)`` once when not. ``app``: the worker's Faust
    app (its tables' changelog topics must exist too); ``health``: the worker's verdict and
    status (``worker.probes.WorkerHealth``)."""

    def __init__(
        self,
        app: faust.App,
        health: Health,
        connection: KafkaConnection,
        limits: WatchdogLimits,
        supervisor_pid: int,
        give_up: Callable[[str, bool], None],
    ) -> None:
        self.app, self.health, self.limits = app, health, limits
        self.supervisor_pid, self.give_up = supervisor_pid, give_up
        self.probe = BrokerProbe(
            connection,
            timeout_s=min(2.0, limits.broker_down_s),
            on_lost=self._lost if limits.exit_on_disconnect else None,
        )
        self._highest: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self._missing_probes = 0

    def _lost(self, what: str) -> None:
        # At once, before this process's consumer can rejoin a restarted broker's group: a
        # member that dies in the middle of a join stays in the group until its session times
        # out, and the next worker's join then takes a second round.
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
        consuming, status = self.health(limits.fetch_stale_s)
        for name, mark in status["highwater"].items():
            if mark < self._highest.get(name, 0):
                return f"{name}'s high watermark went from {self._highest[name]} to {mark}{_LOG_LOST}"
            self._highest[name] = mark
        if status["group_settled_for_s"] > limits.unassigned_s:
            return f"no assignment from the deciders' group for {limits.unassigned_s:.0f} s"
        unsettled = status["group_settled_for_s"] > 0
        if self._lasted("stale", not unsettled and not consuming, now) > limits.fetch_stale_s:
            return f"the worker's fetches were not answered for {limits.fetch_stale_s:.0f} s"
        return None

    def _lasted(self, what: str, bad: bool, now: float) -> float:
        """How long ``bad`` has held (0 while it does not)."""
        if not bad:
            self._since.pop(what, None)
            return 0.0
        return now - self._since.setdefault(what, now)
