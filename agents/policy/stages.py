"""The three stage interfaces of the scheduler pipeline, and their contracts.

In the style of the Kubernetes scheduler framework and the llm-d endpoint picker: each decision
is a small plugin with one job, called at a documented point, with documented units and ranges.
``Scheduler`` (``agents/policy/pipeline.py``) runs them in order for every offer of a request:

    admission (SLOMax)  ->  DC selection (FleetMind)  ->  instance selection (TokenPilot, peers)

Common rules for every stage:
- Times are seconds on the driver's clock (the simulator's, or wall time in the service);
  token counts are tokens, KV counts are blocks of ``BLOCK_TOKENS``.
- A stage may mutate its own state only. The ``ClusterView`` and ``RequestView`` it is given,
  and the candidate masks, are shared and read-only.
- Per-snapshot work (alignment, caches) keys on ``view.version``, never on object identity.
- ``observe`` is called in time order with every observation (KV events only when the stage set
  ``wants_kv_events``); it must be cheap, idempotent for a repeated event of an attempt it no
  longer tracks, and must not raise on unknown instances or attempts.
- No stage reads the true output length: it is not in any of its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.types import (
    Admission,
    BoolArray,
    ClusterView,
    DcChoice,
    HeldElsewhere,
    Observation,
    Placement,
    RequestView,
)

if TYPE_CHECKING:  # slomax imports this module
    from agents.policy.slomax.feedback import GoodputSource


@runtime_checkable
class AdmissionStage(Protocol):
    """Whether and when a request runs.

    Called with every batch of request offers: new arrivals, and held requests again whenever
    the snapshot changes. Returns exactly one ``Admission`` per request, in order: ``admit``
    (go on to DC and instance selection), ``queue`` in a named pool (offered again at the next
    snapshot), or ``reject`` with a machine-readable reason. Never pre-empts running work.
    """

    name: str
    wants_kv_events: bool

    def admit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Admission]: ...

    def observe(self, event: Observation) -> None: ...


@runtime_checkable
class DcSelectionStage(Protocol):
    """Which data centre: hard rules first (allowed regions, model, ready, reachable), then cost.

    Called once per admitted request, before instance selection. Returns the candidate rows
    (a mask over ``view``) of the chosen DC(s); an empty mask means no allowed DC can serve the
    request on this snapshot.
    """

    name: str
    wants_kv_events: bool

    def select(self, request: RequestView, view: ClusterView, now_s: float) -> DcChoice: ...

    def observe(self, event: Observation) -> None: ...


@runtime_checkable
class InstanceSelectionStage(Protocol):
    """Which instance among the candidates: filter -> score -> pick.

    Called with a batch of admitted requests and one non-empty candidate mask per request
    (the same order); returns exactly one ``Placement`` per request, a row where its mask is
    true. Requests are decided in order, and each placement counts in the stage's own in-flight
    accounting before the next is decided, so a burst cannot pile onto one instance. A stage may
    revise the prediction of an earlier request of the same batch (TokenPilot does, when a later
    request joins its first engine step).
    """

    name: str
    wants_kv_events: bool

    def place(
        self,
        requests: Sequence[RequestView],
        candidates: Sequence[BoolArray],
        view: ClusterView,
        now_s: float,
    ) -> list[Placement]: ...

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        """Where a disaggregated ``request`` decodes, asked when its KV cache is ready to move
        (its prefill just ended): an instance of ``decided_id``'s DC that may decode it, by
        ``view``; ``decided_id`` (the decision's) if the stage binds the decode side up front."""
        ...

    def observe(self, event: Observation) -> None: ...


@runtime_checkable
class RouterAware(Protocol):
    """An admission or DC-selection stage that reads the router's predictions: the ``Scheduler``
    hands it the instance-selection stage once, at construction (it may use ``predict_rows`` if
    the router is a ``RowPredictor``)."""

    def bind_router(self, router: object) -> None: ...


@runtime_checkable
class HoldAware(Protocol):
    """An admission stage told when a request it had queued leaves its pool unanswered (its
    client gave up), so it can forget it."""

    def withdrawn(self, key: tuple[str, int]) -> None: ...


@runtime_checkable
class DecidesInLane(Protocol):
    """An admission or instance-selection stage that decides differently as decider k of its
    pool's n (``agents/policy/lanes.py``). The ``Scheduler`` sets ``lane = (k, n)`` before any
    offer and again whenever the pool's deciders change; (0, 1) until then. TokenPilot breaks
    near-ties towards the instances of its own lane (``InstanceSelector.in_lane``); SLOMax counts
    the holds of the deciders of later lanes (``SharesHolds``)."""

    lane: tuple[int, int]


@runtime_checkable
class SharesHolds(Protocol):
    """An admission stage that counts the holds of the pool's other deciders
    (``HeldElsewhere``, read from the admission log) as well as its own."""

    def held_elsewhere(self, event: HeldElsewhere) -> None: ...


@runtime_checkable
class PlacementAware(Protocol):
    """An admission stage told where each request it admitted was placed (instance id), e.g. to
    keep per-instance shares."""

    def placed(self, request: RequestView, instance_id: str) -> None: ...


@runtime_checkable
class AdmitsAsOffered(Protocol):
    """An admission stage whose answers do not depend on the order of an offer's requests
    (``PassThrough``: it admits every one), so the router may place a batch of arrivals in its
    own order (``OrdersBatch``). Any other admission judges each request of an offer behind the
    ones it admitted before it, in its own serving order, and the batch is placed in that order."""

    admits_as_offered: bool


@runtime_checkable
class OrdersBatch(Protocol):
    """An instance-selection stage that decides a batch of new arrivals in an order of its own:
    ``order`` returns a permutation of the batch's indices. The ``Scheduler`` places the batch
    and reports its outcomes in that order, so the engines receive the requests in the order
    they were decided (a stage's predictions assume that queue order); so are arrivals deferred
    for the decision log (several deciders), when due. Held requests offered again keep their
    order, and only an admission stage that ``AdmitsAsOffered`` lets the router order. Behind any
    admission, while ``reorders`` the scheduler
    places an instant's long-context arrivals before its short ones."""

    def order(
        self, requests: Sequence[RequestView], candidates: Sequence[BoolArray], view: ClusterView
    ) -> list[int]: ...

    def reorders(self, view: ClusterView) -> bool:
        """Whether ``order`` would reorder a burst on ``view`` now (its condition on the pool):
        the scheduler then places a burst's long-context arrivals first (with several deciders,
        decider after decider) and the short ones after them, behind any admission stage."""
        ...


@runtime_checkable
class Noticing(Protocol):
    """A stage with something to tell operators (FleetMind's DC state changes, reservation
    moves, replica advice): ``drain_notices`` returns what happened since the last call."""

    def drain_notices(self) -> list[FleetNotice]: ...

    def refresh(self, view: ClusterView, now_s: float) -> None:
        """Look at the fleet on ``view`` without a request (the driver's timer calls it), so a
        DC whose heartbeats stopped is noticed even when no request comes."""


@runtime_checkable
class ClosesLoop(Protocol):
    """An admission stage that steers itself on observed outcomes (SLOMax's control loop): it
    reads per-class windows from a ``GoodputSource`` and hands each control step to ``record``.
    The simulator binds an in-memory or ClickHouse source, the worker the store's; both through
    ``Scheduler.bind_feedback``."""

    def bind_feedback(self, source: GoodputSource, record: Callable[[Any], None] | None = None) -> None: ...
