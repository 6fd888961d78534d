"""Several deciders of one pool: N schedulers, each deciding the requests its partition brings,
each reading the others' placements from the decision log a little late.

In the service a pool's requests are spread over partitions by an affinity key, and each worker
(a decider, a full ``Scheduler``) decides what its partitions bring. Every worker reads the
pool's heartbeats, KV events, first tokens and completions, and the other workers' placements
from ``tf.decisions``, ``decision_log_delay_s`` after they were made (the embedded broker's
round trip: a few milliseconds, docs/results/real-engines.md). ``Deciders`` plays that in the simulator:

- which decider decides a request (``decider_of``): ``affinity``, the request's affinity key
  modulo N: the chained hash of its prompt's first min(4, n) blocks (it names that whole
  2 048-token prefix, so requests sharing it meet the same decider), or for a prompt shorter
  than a block the CRC-32 of its tenant; a key hotter than the publisher's threshold is spread
  over sub-keys as the service's publishers do (``agents.policy.common.hot_keys``: above 500
  requests per second, which none of the shipped workloads reaches); ``random``, uniform per
  request from the run's seed (replicas behind a load balancer without affinity). Either way
  the deciders share the log.
- what a decider sees: every snapshot (``tick``), first token, end and KV event of the pool
  (``observe``), and each placement another decider made, as ``Placed`` stamped with the time
  it was made, once ``decision_log_delay_s`` has passed. The log is read at each offer and each
  observation (delivery is due by then; a ``Placed`` carries its own time, so when it is read
  changes nothing a stage computes from it); a placement is always read before its request's
  first token or end (a first token cannot come within a few milliseconds, but an engine may
  refuse a request at once).
- arrivals wait a few log delays at decider k before they are decided (k for the class a
  burst places first, n + k for the other: ``Scheduler.submit``, as in the service; the runner
  wakes the deciders then, ``next_wake_s``), so they are decided once the log shows the
  placements of their instant that they should go around.
- held requests stay with the decider that holds them: each re-offers its own (``tick``; decider
  k k log delays after a new snapshot, the runner waking it then), and
  a client's give-up withdraws the request where it is held. A new hold is logged as a
  placement is (``HeldElsewhere``, the admission log ``tf.admission`` in the service) for the
  deciders whose admission counts the pool's holds (SLOMax).

What the runner drives is ``pool_decider_for``'s: with one decider the ``Scheduler`` itself
(``scheduler_for``: as the simulator deploys it), so results are those of one decider.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from agents.policy.common.hot_keys import HotKeys
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.pipeline import Scheduler
from agents.policy.registry import StageParams, build_scheduler, with_deployment
from agents.policy.types import (
    ClusterView,
    Finished,
    FirstToken,
    HeldElsewhere,
    Observation,
    Outcome,
    Placed,
    RequestView,
)
from schemas.events import AFFINITY_BLOCKS  # the service's: prompt blocks the affinity key covers
from sim.engine.fleet import FleetSpec

# A placement due at the instant the log is read is read then: a decider that defers an arrival
# j log delays must see what another placed i < j delays after the same arrival, and the two
# sums of floats (arrival + i delays + one delay, arrival + (i + 1) delays) may differ in the
# last bit.
_SAME_INSTANT_S = 1e-9

if TYPE_CHECKING:
    from agents.policy.slomax.feedback import GoodputSource
    from sim.loop.config import SimConfig

DeciderSplit = Literal["affinity", "random"]
SPLITS: tuple[DeciderSplit, ...] = ("affinity", "random")
DECISION_LOG_DELAY_S = 0.005
"""How late a decider reads the others' placements: the embedded broker's round trip."""


class PoolDecider(Protocol):
    """What the discrete-event runner drives: one ``Scheduler``, or ``Deciders``."""

    name: str

    @property
    def wants_kv_events(self) -> bool: ...

    def submit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Outcome]: ...

    def tick(self, view: ClusterView, now_s: float) -> list[Outcome]: ...

    def next_wake_s(self) -> float | None: ...

    def withdraw(self, request_id: str, attempt: int) -> bool: ...

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str: ...

    def observe(self, event: Observation) -> None: ...

    def notices(self) -> list[FleetNotice]: ...

    def bind_feedback(self, source: GoodputSource, record: Callable[[Any], None] | None = None) -> bool: ...


def affinity_key(request: RequestView) -> int:
    """The request's affinity key (module docstring): stable across processes and runs."""
    blocks = request.block_hashes
    if blocks:
        return blocks[min(AFFINITY_BLOCKS, len(blocks)) - 1]
    return zlib.crc32(request.tenant.encode())


def caption(document: Mapping[str, Any]) -> str:
    """`` | N deciders per pool (SPLIT split, log D ms late)`` for a result document of several
    deciders (``SimConfig.deciders_fields``); empty for one (its documents are as they were)."""
    if "deciders" not in document:
        return ""
    split, delay_ms = document["decider_split"], 1000 * document["decision_log_delay_s"]
    return f" | {document['deciders']} deciders per pool ({split} split, log {delay_ms:g} ms late)"


@dataclass(slots=True)
class _Logged:
    """A placement (decision log) or a new hold (admission log): due to the other deciders at
    ``due_s``."""

    due_s: float
    origin: int
    event: Placed | HeldElsewhere
    read: bool = False


class Deciders:
    """N ``Scheduler``s of one pool and the decision log between them (module docstring)."""

    def __init__(
        self,
        schedulers: Sequence[Scheduler],
        log_delay_s: float = DECISION_LOG_DELAY_S,
        split: DeciderSplit = "affinity",
        seed: int = 0,
    ) -> None:
        if not schedulers:
            raise ValueError("Deciders needs at least one scheduler")
        if split not in SPLITS:
            raise ValueError(f"unknown decider split {split!r}; known: {', '.join(SPLITS)}")
        if not log_delay_s >= 0:
            raise ValueError("the decision log's delay must be >= 0 seconds")
        self.schedulers = tuple(schedulers)
        for k, scheduler in enumerate(self.schedulers):
            scheduler.decide_in_lane(k, len(self.schedulers), log_delay_s)
        self.name = schedulers[0].name
        self.log_delay_s = log_delay_s
        self.split = split
        self._rng = np.random.default_rng([seed, 0xDEC1DE])
        self._hot = HotKeys()  # the publisher's: a hot prefix is spread over the deciders
        self._log: deque[_Logged] = deque()  # in due order: one delay, placements in time order
        self._unread: dict[tuple[str, int], _Logged] = {}
        self._placed_by: dict[tuple[str, int], int] = {}  # disaggregated requests' deciders
        self._holds_shared = any(s.wants_holds for s in self.schedulers)  # (the service's too)

    @property
    def wants_kv_events(self) -> bool:
        return any(s.wants_kv_events for s in self.schedulers)

    def decider_of(self, request: RequestView, now_s: float) -> int:
        n = len(self.schedulers)
        if self.split == "random":
            return int(self._rng.integers(n))
        key = affinity_key(request)
        spread = self._hot.affinity(str(key), request.request_id, now_s)
        return zlib.crc32(spread.encode()) % n if spread else key % n

    # --- the Scheduler's interface, over the N deciders -----------------------------------------

    def submit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Outcome]:
        """Each decider decides the arrivals its partition brings (in decider order, on the
        same snapshot); the outcomes of all."""
        groups: dict[int, list[RequestView]] = {}
        for request in requests:
            groups.setdefault(self.decider_of(request, now_s), []).append(request)
        outcomes: list[Outcome] = []
        for index in sorted(groups):
            self._read_log(now_s)  # (with no delay: what the deciders before it placed just now)
            outcomes += self._logged(index, self.schedulers[index].submit(groups[index], view, now_s), now_s)
        return outcomes

    def tick(self, view: ClusterView, now_s: float) -> list[Outcome]:
        """Each decider offers the requests it holds again."""
        outcomes: list[Outcome] = []
        for index, scheduler in enumerate(self.schedulers):
            self._read_log(now_s)
            outcomes += self._logged(index, scheduler.tick(view, now_s), now_s)
        return outcomes

    def next_wake_s(self) -> float | None:
        """When a decider's earliest deferred request is due (``Scheduler.next_wake_s``)."""
        wakes = [w for w in (s.next_wake_s() for s in self.schedulers) if w is not None]
        return min(wakes, default=None)

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        """The decider that placed the request binds its decode side (``Scheduler.bind_decode``)."""
        origin = self._placed_by.pop(request.key, 0)
        return self.schedulers[origin].bind_decode(request, view, decided_id, now_s)

    def withdraw(self, request_id: str, attempt: int) -> bool:
        """Drop the request from the decider that holds it; False if none does."""
        return any(s.withdraw(request_id, attempt) for s in self.schedulers)

    def observe(self, event: Observation) -> None:
        """Every decider sees every first token, end and KV event of the pool."""
        if isinstance(event, FirstToken | Finished):
            self._read_log(event.time_s)
            unread = self._unread.get((event.request_id, event.attempt))
            if unread is not None:
                self._deliver(unread)
        for scheduler in self.schedulers:
            scheduler.observe(event)

    def notices(self) -> list[FleetNotice]:
        return [n for s in self.schedulers for n in s.notices()]

    def bind_feedback(self, source: GoodputSource, record: Callable[[Any], None] | None = None) -> bool:
        """Every decider's admission reads the same store (the service's deciders share it)."""
        bound = [s.bind_feedback(source, record) for s in self.schedulers]
        return any(bound)

    # --- the decision log -------------------------------------------------------------------------

    def _logged(self, origin: int, outcomes: list[Outcome], now_s: float) -> list[Outcome]:
        """Write decider ``origin``'s placements and new holds into the log (a scheduler's
        ``queue`` outcomes are the requests it newly held)."""
        for outcome in outcomes:
            request, due_s = outcome.request, now_s + self.log_delay_s
            if outcome.action == "admit":
                placed = Placed(request, outcome.instance_id, now_s, outcome.predicted_ttft_s)
                if outcome.prefill_instance >= 0:
                    self._placed_by[request.key] = origin
                entry = _Logged(due_s, origin, placed)
                self._log.append(entry)
                self._unread[request.key] = entry
            elif outcome.action == "queue" and self._holds_shared:
                held = HeldElsewhere(
                    request.request_id,
                    request.attempt,
                    request.slo_class,
                    now_s,
                    input_tokens=request.input_tokens,
                    lane=origin,
                )
                self._log.append(_Logged(due_s, origin, held))
        return outcomes

    def _read_log(self, now_s: float) -> None:
        """Deliver every placement due by ``now_s`` to the deciders that did not make it."""
        log, due_by = self._log, now_s + _SAME_INSTANT_S
        while log and log[0].due_s <= due_by:
            entry = log.popleft()
            if not entry.read:
                self._deliver(entry)

    def _deliver(self, entry: _Logged) -> None:
        entry.read = True
        if isinstance(entry.event, Placed):
            del self._unread[entry.event.request.key]
        for index, scheduler in enumerate(self.schedulers):
            if index != entry.origin:
                scheduler.observe(entry.event)


def pool_decider_for(
    policy_name: str, fleet: FleetSpec, config: SimConfig, params: StageParams | None = None
) -> PoolDecider:
    """``scheduler_for``'s scheduler, or with ``config.deciders`` > 1 that many, decider k
    seeded with ``config.seed + k``, sharing a decision log (``Deciders``)."""
    if config.deciders == 1:
        return scheduler_for(policy_name, fleet, config, params)
    schedulers = [
        scheduler_for(policy_name, fleet, replace(config, seed=config.seed + k), params)
        for k in range(config.deciders)
    ]
    return Deciders(schedulers, config.decision_log_delay_s, config.decider_split, config.seed)


def scheduler_for(
    policy_name: str, fleet: FleetSpec, config: SimConfig, params: StageParams | None = None
) -> Scheduler:
    """A fresh scheduler for ``policy_name`` as the simulator deploys it on ``fleet``."""
    deployed = with_deployment(policy_name, params, config.heartbeat_s, fleet.rules)
    return build_scheduler(policy_name, seed=config.seed, params=deployed)
