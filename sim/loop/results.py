"""What a simulated run yields: every admit as it happened (``Send``) and the run's result."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.policy.fleetmind.notices import FleetNotice
from sim.engine.attempt import Attempt
from sim.engine.fleet import InstanceSpec
from sim.workloads.trace import TraceRequest


@dataclass(frozen=True, slots=True)
class Send:
    """One admit, as it happened: ``request`` (its tenant, home DC, allowed regions, model and
    version as the client sent them), attempt number ``attempt``, sent at ``sent_s`` to instance
    ``instance_id`` of DC ``dc``, which serves ``model`` at ``version``. ``row_ready`` and
    ``row_taken_s``: the ready flag of the newest heartbeat row of that instance the scheduler
    had when it decided, and when that row was taken (its age is ``sent_s - row_taken_s``)."""

    request: TraceRequest
    attempt: int
    sent_s: float
    instance_id: str
    dc: str
    model: str
    version: str
    row_ready: bool
    row_taken_s: float


@dataclass(slots=True)
class RunResult:
    policy: str
    attempts: list[Attempt]
    window: tuple[float, float]
    busy_s: list[float]
    sends: list[Send] = field(default_factory=list)  # every admit, in the order decided
    notices: list[FleetNotice] = field(default_factory=list)
    held_s: list[float] = field(default_factory=list)  # GPUs held inside the window, per row
    instances: tuple[InstanceSpec, ...] = ()  # the rows (the fleet's, and the planner's slots)
    planner: str = "static"
    shape: dict[str, object] = field(default_factory=dict)  # ``Replicas.figures``
    kv_links: dict[str, float] = field(default_factory=dict)  # ``KvLinks.figures``
