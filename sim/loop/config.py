"""What is the same for every policy in one simulated comparison: ``SimConfig`` (the seed, the
heartbeat and its delivery delay, the engine options, the clients' rules and output budget, the
SLO classes, and several deciders per pool)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agents.policy.common.slo import DEFAULT_SLO_CLASSES, SloClass
from agents.policy.fleetmind.capacity import STALE_AFTER_HEARTBEATS
from sim.engine.profiles import EngineOptions
from sim.loop.clients import ClientRules
from sim.loop.deciders import DECISION_LOG_DELAY_S, SPLITS, DeciderSplit
from sim.workloads.trace import DEFAULT_OUTPUT_BUDGET, TraceRequest


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs that are the same for every policy in one comparison. ``ValueError`` for a
    ``signal_delay_s`` at or above the staleness window (``STALE_AFTER_HEARTBEATS`` heartbeat
    intervals, FleetMind's and the view's), or a bad deciders setting."""

    seed: int = 0
    heartbeat_s: float = 0.25
    signal_delay_s: float = 0.02  # heartbeat/KV-event delivery delay: tens of ms in a deployment
    engine: EngineOptions | None = None  # None: each profile's own options (vLLM V1's behaviour)
    retry_share: float = 0.5
    output_budget: int | None = None
    slo_classes: dict[str, SloClass] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    deciders: int = 1  # per pool (``sim/loop/deciders.py``); 1: the scheduler alone
    decision_log_delay_s: float = DECISION_LOG_DELAY_S  # how late a decider reads the others'
    decider_split: DeciderSplit = "affinity"  # which decider decides a request

    def __post_init__(self) -> None:
        if self.deciders < 1:
            raise ValueError(f"deciders must be at least 1, not {self.deciders}")
        window = STALE_AFTER_HEARTBEATS * self.heartbeat_s
        if self.signal_delay_s >= window:
            # Every row would be older than the window whenever read: every instance stale on
            # arrival, and a router that keeps to fresh rows (FleetMind) would serve nothing.
            raise ValueError(
                f"--signal-delay {self.signal_delay_s:g} s is at or above the staleness window "
                f"({STALE_AFTER_HEARTBEATS} heartbeats of {self.heartbeat_s:g} s = {window:g} s): every "
                "instance would look stale on arrival; give a shorter --signal-delay or a longer --heartbeat"
            )
        if not (self.decision_log_delay_s >= 0 and np.isfinite(self.decision_log_delay_s)):
            raise ValueError("decision_log_delay_s must be a finite number of seconds >= 0")
        if self.decider_split not in SPLITS:
            raise ValueError(f"unknown decider split {self.decider_split!r}; known: {', '.join(SPLITS)}")

    def deciders_fields(self) -> dict[str, object]:
        """What a result document says of several deciders per pool (nothing for one)."""
        if self.deciders == 1:
            return {}
        return {
            "deciders": self.deciders,
            "decider_split": self.decider_split,
            "decision_log_delay_s": self.decision_log_delay_s,
        }

    def budget_for(self, request: TraceRequest) -> int:
        """What the client allows (``max_tokens``): fixed if configured, else the request's own
        ``max_tokens``, else 2048."""
        if self.output_budget is not None:
            return self.output_budget
        return request.max_tokens or DEFAULT_OUTPUT_BUDGET

    def clients(self) -> ClientRules:
        """The emulated clients' give-up and retry rules (``sim/loop/clients.py``)."""
        return ClientRules(self.slo_classes, self.seed, self.retry_share)
