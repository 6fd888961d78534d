"""How a ``tokenfleet up --planner`` stack follows its planner: servers start, drain and stop.

The planner (``tokenfleet planner``, a part of the stack) publishes ``ReplicaPlan`` events on
``tf.plans``; ``PlanFeed`` reads them, and the heartbeats on ``tf.heartbeats``, in a thread of
its own, and the supervisor hands them to the ``Follower`` and calls ``Follower.step`` every
poll. The follower decides; the supervisor does (``Servers``: start a part, stop it, write the
dispatcher's inventory). Its rules:

- **Desired.** The newest plan (by ``ts``) for the stack's model and DC (and version, when the
  plan names one) gives ``desired = clamp(replicas, MIN_REPLICAS, slots)``; before any plan the
  servers stay as they started.
- **Roles.** Every server runs ``prefill`` (only the prefill legs of disaggregated calls) or
  ``both``; the servers that start with the stack run ``both``. Of the ``desired`` servers,
  ``prefill = min(prefill_replicas, desired - MIN_BOTH)`` run prefill only (``prefill_replicas``
  None: the prefill servers it runs, at most that many), the rest ``both``: two targets, each
  converged by the rules below on the servers of its role. At least ``MIN_BOTH`` server stays
  ``both``: a prefill-only server serves no call whole. A server's role is given when it starts
  and kept until it stops (the KV connector's side is chosen at launch). A stack whose servers
  have no KV connector ignores the plans' prefill counts (said once): every server runs
  ``both``, since none could hand a KV cache over.
- **Active** servers are those started and not draining (loading, ready, or being restarted
  after a crash); the dispatcher's inventory lists exactly them, each with its role (so its
  heartbeats say it), so a loading server heartbeats not ready (the planner sees it loading)
  and one that answers its ``/health`` heartbeats ready (the deciders may send it calls from
  then on).
- **More** (a role's active servers below its target): a draining server of that role is taken
  back first (listed again: it serves again, nothing to load), the most recently drained first;
  then standby slots start in that role, in slot order.
- **Fewer** (a role's active servers above its target; all of them are taken out before any
  starts, so with the prefill count above its target a prefill server drains first, below it a
  ``both`` one): servers not ready yet are taken out first (nothing can run there), then the
  ready ones with the least work by their newest heartbeat (running + waiting, then tokens in
  flight), the last slot first on a tie. Taken out of the dispatcher's inventory, the server
  **drains**: the dispatcher heartbeats it ``draining: true``, so no decider sends it
  anything new, and what it runs finishes.
- **Stop.** A draining server is stopped once its heartbeats, from the first one that said
  ``draining``, said it idle (``running == waiting == tokens_in_flight == 0``: nothing runs or
  waits on the engine, and no call decided for it through the gateway or the dispatcher is open)
  for ``drain_grace_s`` without a break: a decision made on a heartbeat from before the drain
  has reached the engine or the log by then. When its heartbeats stop for ``drain_grace_s``
  (the dispatcher forgot it: it stopped answering, or the dispatcher restarted), the engine's
  own ``/metrics`` say whether it runs anything (one that does not answer runs nothing). Once
  its process is gone the slot is ``standby`` again.

Nothing a user sent is lost by a scale-down: a server stops only when idle past the grace. The
drain is Kubernetes' terminating endpoint (KEP-1672, https://www.kubernetes.dev/resources/keps/1672/:
the endpoint stays listed, not ready for new traffic, while what it serves finishes), with the
heartbeat's ``draining`` as the ``terminating`` condition.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiokafka.errors import KafkaError

from dispatcher.engines.vllm.metrics import parse_metrics
from infra.kafka.clients import LogWatch, TopicsMissing, partition_reader
from infra.kafka.connection import KafkaConnection
from local.scaling import MIN_REPLICAS, Scaling
from schemas.codec import DecodeError, decode
from schemas.events import Heartbeat, ReplicaPlan, Role
from schemas.topics import HEARTBEATS, PLANS
from streams.clients import stop_client

log = logging.getLogger(__name__)

ACTIVE = ("starting", "loading", "ready", "restarting", "exited")
"""A server slot's states (``PartState.state``) that count towards the plan: started, not draining."""
MIN_BOTH = 1
"""Servers a plan leaves ``both`` at least (module docstring)."""


class Servers(Protocol):
    """What the follower asks of the supervisor, for the server slots of ``Scaling.servers``."""

    def state(self, name: str) -> str:
        """The part's state: ``standby`` (not running), one of ``ACTIVE``, ``draining``, ``stopping``."""
        ...

    def start(self, name: str, role: Role) -> None:
        """Launch a standby server in ``role`` (its state becomes ``loading``)."""
        ...

    def mark(self, name: str, state: str, detail: str) -> None:
        """Record the part's state (``draining``, or back to active when taken back)."""
        ...

    def stop(self, name: str) -> None:
        """Stop a drained server (state ``stopping``; ``standby`` once ``gone``)."""
        ...

    def gone(self, name: str) -> bool:
        """Its process has ended (stopped, or exited by itself)."""
        ...

    def busy(self, name: str) -> bool:
        """Its engine's own ``/metrics`` show a call running or waiting (False: none, or no answer)."""
        ...

    def publish(self, active: Mapping[str, Role]) -> None:
        """Write the dispatcher's inventory: these servers, each in its role (in slot order)."""
        ...


@dataclass(slots=True)
class _Drain:
    """One draining server: when it was taken out (wall s), what it was, its heartbeats since."""

    marked_at: float
    was: str
    last_beat: float | None = None  # ts of its newest heartbeat saying draining
    idle_since: float | None = None  # start of the unbroken idle streak (None: not idle now)


class Follower:
    """Follows the plans for one stack (module docstring); ``say`` reports each change.
    ``kv_connector``: the servers can hand KV caches over, so the plans' prefill counts are
    followed (else ignored)."""

    def __init__(
        self, scaling: Scaling, servers: Servers, say: Callable[[str], None], *, kv_connector: bool = False
    ) -> None:
        self.scaling = scaling
        self.servers = servers
        self.say = say
        self.kv_connector = kv_connector
        self.desired: int | None = None
        self.prefill: int | None = None  # the plan's prefill servers (None: keep those running)
        self.plan: ReplicaPlan | None = None
        self.beats: dict[str, Heartbeat] = {}
        self.drains: dict[str, _Drain] = {}
        self.roles: dict[str, Role] = {}  # the role each server was started in (absent: both)
        self._said_ignored = False

    # -- what it is told ---------------------------------------------------------------------

    def observe(self, event: ReplicaPlan | Heartbeat) -> None:
        """A plan or a heartbeat from the log, in the log's order."""
        if isinstance(event, ReplicaPlan):
            self._plan(event)
        elif event.instance_id in self.scaling.servers:
            self._beat(event)

    def _plan(self, plan: ReplicaPlan) -> None:
        s = self.scaling
        if (plan.model, plan.dc) != (s.model, s.dc) or plan.model_version not in ("", s.version):
            return
        if self.plan is not None and plan.ts < self.plan.ts:
            return  # an older plan read late (after a reconnect): the newer one stands
        self.plan = plan
        desired = min(max(plan.replicas, MIN_REPLICAS), len(s.servers))
        prefill = plan.prefill_replicas if self.kv_connector else None
        if plan.prefill_replicas and not self.kv_connector and not self._said_ignored:
            self._said_ignored = True
            self.say(
                f"plan of {plan.planner} asks {plan.prefill_replicas} prefill-only servers: ignored, "
                "the servers have no KV connector to hand a KV cache over (tokenfleet up --kv-connector)"
            )
        if (desired, prefill) != (self.desired, self.prefill):
            clamp = "" if desired == plan.replicas else f" (asked {plan.replicas})"
            split = f", {prefill} prefill only" if prefill else ""
            reason = f": {plan.reason}" if plan.reason else ""
            self.say(f"plan of {plan.planner}: {desired} servers{split}{clamp}{reason}")
        self.desired, self.prefill = desired, prefill

    def _beat(self, beat: Heartbeat) -> None:
        known = self.beats.get(beat.instance_id)
        if known is None or beat.ts >= known.ts:
            self.beats[beat.instance_id] = beat
        drain = self.drains.get(beat.instance_id)
        if drain is None or not beat.draining or beat.ts < drain.marked_at:
            return  # not draining, or from before the dispatcher took the drain up
        drain.last_beat = beat.ts
        idle = beat.running == 0 and beat.waiting == 0 and beat.tokens_in_flight == 0
        if not idle:
            drain.idle_since = None
        elif drain.idle_since is None:
            drain.idle_since = beat.ts

    # -- what it does ------------------------------------------------------------------------

    def step(self, now: float) -> None:
        """Stop what drained, then converge on the plan (``now``: wall seconds, as heartbeats'):
        every role's excess drains before any role's shortfall starts."""
        self._finish_drains(now)
        if self.desired is None:
            return
        targets = self.targets()
        changed = False
        for role, target in targets.items():
            mine = self._active_in(role)
            if len(mine) > target:
                self._shrink(mine, len(mine) - target, now)
                changed = True
        for role, target in targets.items():
            short = target - len(self._active_in(role))
            if short > 0:
                changed |= self._grow(role, short)
        if changed:
            self.servers.publish(self.inventory())

    def targets(self) -> dict[Role, int]:
        """Servers wanted per role (module docstring); ``desired`` must be known."""
        assert self.desired is not None
        running = len(self._active_in("prefill"))
        wanted = running if self.prefill is None else self.prefill
        prefill = max(0, min(wanted, self.desired - MIN_BOTH))
        return {"prefill": prefill, "both": self.desired - prefill}

    def active(self) -> list[str]:
        """The servers that count towards the plan, in slot order."""
        return [name for name in self.scaling.servers if self.servers.state(name) in ACTIVE]

    def role(self, name: str) -> Role:
        """The role server ``name`` was started in."""
        return self.roles.get(name, "both")

    def inventory(self) -> dict[str, Role]:
        """The dispatcher's inventory: every active server with its role, in slot order."""
        return {name: self.role(name) for name in self.active()}

    def _active_in(self, role: Role) -> list[str]:
        return [name for name in self.active() if self.role(name) == role]

    def _grow(self, role: Role, more: int) -> bool:
        """Take back draining servers of ``role``, then start standby slots in it; whether any."""
        back = sorted(
            (
                n
                for n, d in self.drains.items()
                if self.servers.state(n) == "draining" and self.role(n) == role
            ),
            key=lambda n: -self.drains[n].marked_at,
        )[:more]
        for name in back:
            drain = self.drains.pop(name)
            self.servers.mark(name, drain.was, "taken back from draining")
        standby = [n for n in self.scaling.servers if self.servers.state(n) == "standby"]
        started = standby[: more - len(back)]
        for name in started:
            self.roles[name] = role
            self.servers.start(name, role)
        return bool(back or started)

    def _shrink(self, active: list[str], fewer: int, now: float) -> None:
        def work(name: str) -> tuple[int, int, int, int]:
            ready = self.servers.state(name) == "ready"
            beat = self.beats.get(name)
            load = (beat.running + beat.waiting, beat.tokens_in_flight) if beat else (0, 0)
            return (int(ready), *load, -self.scaling.servers.index(name))

        for name in sorted(active, key=work)[:fewer]:
            self.drains[name] = _Drain(marked_at=now, was=self.servers.state(name))
            self.servers.mark(name, "draining", "taken out of the dispatcher's engines")

    def _finish_drains(self, now: float) -> None:
        for name in list(self.drains):
            state = self.servers.state(name)
            if state == "stopping":
                if self.servers.gone(name):
                    del self.drains[name]
                    self.servers.mark(name, "standby", "drained and stopped")
            elif state != "draining":
                del self.drains[name]  # gone by itself, or taken back
            elif self.servers.gone(name):
                del self.drains[name]
                self.servers.mark(name, "standby", "exited while draining")
            elif self._drained(name, self.drains[name], now):
                self.say(f"{name}: drained, stopping it")
                self.servers.stop(name)

    def _drained(self, name: str, drain: _Drain, now: float) -> bool:
        grace = self.scaling.drain_grace_s
        heard = drain.last_beat if drain.last_beat is not None else drain.marked_at
        if now - heard > grace:  # no heartbeat of it lately: ask the engine itself
            if self.servers.busy(name):
                drain.idle_since = None
            elif drain.idle_since is None:
                drain.idle_since = now
        return drain.idle_since is not None and now - drain.idle_since >= grace


def engine_busy(metrics_url: str, model: str, timeout_s: float = 2.0) -> bool:
    """Whether the engine's ``/metrics`` at ``metrics_url`` show a call of ``model`` running or
    waiting; False when it does not answer (a server that does not answer runs nothing)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as page:
            metrics = parse_metrics(page.read().decode(), model)
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return metrics.running + metrics.waiting > 0


class PlanFeed:
    """The plans on ``tf.plans`` and the heartbeats on ``tf.heartbeats``, from ``since`` (wall
    seconds) on, read by a thread of its own; ``take`` returns what came since the last call.
    A broker that goes away is connected to again (every second), from a few seconds before the
    last record read; a log that started again (a restarted embedded broker) is read from its
    start."""

    RESUME_MARGIN_S = 5.0

    def __init__(self, connection: KafkaConnection, since: float) -> None:
        self.connection = connection
        self._from = since
        self._events: queue.SimpleQueue[ReplicaPlan | Heartbeat] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plan-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> list[ReplicaPlan | Heartbeat]:
        taken = []
        while True:
            try:
                taken.append(self._events.get_nowait())
            except queue.Empty:
                return taken

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._read())

    async def _read(self) -> None:
        while not self._stop.is_set():
            try:
                reader = await partition_reader(
                    self.connection, [PLANS, HEARTBEATS], max(time.time() - self._from, 0.0), "up's plan feed"
                )
            except (KafkaError, OSError, TopicsMissing) as exc:
                log.info("plan feed: no broker yet (%s)", type(exc).__name__)
                await asyncio.sleep(1.0)
                continue
            watch = LogWatch(reader, "up's plan feed")
            try:
                while not self._stop.is_set():
                    for records in (await reader.getmany(timeout_ms=200)).values():
                        for record in records:
                            self._put(record.topic, record.value)
                    await watch.check()
            except Exception as exc:  # a lost broker, or anything else: the stack keeps following
                log.warning(
                    "plan feed: %s; reading again", exc, exc_info=not isinstance(exc, KafkaError | OSError)
                )
                await asyncio.sleep(1.0)
            finally:
                await stop_client(reader, 2.0)

    def _put(self, topic: str, value: bytes | None) -> None:
        try:
            event: ReplicaPlan | Heartbeat = (
                decode(ReplicaPlan, value) if topic == PLANS.name else decode(Heartbeat, value)
            )
        except DecodeError:
            return  # the publisher's dead letters, not ours
        self._from = max(self._from, event.ts - self.RESUME_MARGIN_S)
        self._events.put(event)
