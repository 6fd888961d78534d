"""Prometheus metrics of the control plane, in a registry of their own.

A dedicated ``REGISTRY`` (not the process-global default) so tests and several apps in one
process never collide on names. Expose it with ``render()`` (mount at ``/metrics`` with
``CONTENT_TYPE``) or ``serve_metrics(port)``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Collection, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from agents.routing import Routed
from schemas.events import AdmissionDecision, FleetEvent

REGISTRY = CollectorRegistry()
CONTENT_TYPE = CONTENT_TYPE_LATEST
NAMESPACE = "tokenfleet"

# 0.5 ms to 1 s: a request waits for the rest of its batch; the target is p99 <= 20 ms.
DECISION_LATENCY_BUCKETS = (
    0.5e-3, 1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3, 15e-3, 20e-3, 30e-3, 50e-3, 100e-3, 250e-3, 1.0,
)  # fmt: skip
# 5 µs to 10 ms: the policy's own share of one decision.
POLICY_LATENCY_BUCKETS = (5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 10e-3)

decisions_total = Counter(
    "decisions",
    "Scheduling decisions, by policy and outcome (admit, queue, reject, routed, ...).",
    ["policy", "outcome"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
decision_latency_seconds = Histogram(
    "decision_latency_seconds",
    "Wall time from a request's arrival at the worker (its batch fetched from the broker) to its "
    "decision handed to the producer.",
    namespace=NAMESPACE,
    buckets=DECISION_LATENCY_BUCKETS,
    registry=REGISTRY,
)
policy_latency_seconds = Histogram(
    "policy_latency_seconds",
    "Time inside the routing policy per decision (its batch's policy time / batch size).",
    namespace=NAMESPACE,
    buckets=POLICY_LATENCY_BUCKETS,
    registry=REGISTRY,
)
placements_observed_total = Counter(
    "placements_observed",
    "Placements of the pool's other deciders (read from tf.decisions) this worker accounted for.",
    ["pool"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
queue_depth = Gauge(
    "queue_depth",
    "Requests waiting, per queue pool.",
    ["pool"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
admissions_total = Counter(
    "admissions",
    "Admission answers per model pool: action (admit, queue, reject) and, for rejects, the reason "
    "code (cannot_meet_slo, over_quota, no_capacity, expired, queue_full, unknown_model, other).",
    ["pool", "action", "reason"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
admission_wait_seconds = Histogram(
    "admission_wait_seconds",
    "Time from a request's arrival (its ts) to its admission, per model pool: queue-pool wait.",
    ["pool"],
    namespace=NAMESPACE,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 15.0, 60.0, 300.0, 1800.0),
    registry=REGISTRY,
)
slomax_knob = Gauge(
    "slomax_knob",
    "SLOMax's control-loop state in force, per policy: headroom (share of the interactive TTFT "
    "objective a prediction may use) and batch_share (of the pool's token capacity).",
    ["policy", "knob"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
fleet_events_total = Counter(
    "fleet_events",
    "What FleetMind told operators (tf.fleet-events), by kind (dc_down, dc_recovering, dc_up, "
    "reservation_moved, replica_advice) and data centre.",
    ["kind", "dc"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
desired_replicas = Gauge(
    "desired_replicas",
    "The replicas of the pool wanted in the data centre: in the active planner (tokenfleet "
    "planner) its newest plan on tf.plans, summed over the model's versions; in a worker, "
    "FleetMind's latest replica advice. Absent until there is one; an autoscaler such as KEDA or "
    "an HPA external metric reads it.",
    ["pool", "dc"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
planner_active = Gauge(
    "planner_active",
    "1 while this planner process is the fleet's active planner (it holds partition 0 of tf.plans "
    "in the planners' consumer group), 0 while it waits.",
    namespace=NAMESPACE,
    registry=REGISTRY,
)
replica_plans_total = Counter(
    "replica_plans",
    "Plans this planner process published on tf.plans, by planner (one per pool it named: "
    "changed, or sent again as a keep-alive).",
    ["planner"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
dlq_total = Counter(
    "dlq",
    "Inputs dead-lettered, by the topic they came from.",
    ["topic"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_rows_total = Counter(
    "feedback_rows",
    "Rows written to the ClickHouse feedback store, by table.",
    ["table"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_buffer_rows = Gauge(
    "feedback_buffer_rows",
    "Feedback rows in the worker's memory buffer, waiting for the ClickHouse writer.",
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_spooled_rows = Gauge(
    "feedback_spooled_rows",
    "Feedback rows waiting in the local disk spool (ClickHouse down or slow), to be drained.",
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_store_up = Gauge(
    "feedback_store_up",
    "1 while the ClickHouse feedback store is connected and accepting writes, else 0.",
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_rejected_rows_total = Counter(
    "feedback_rejected_rows",
    "Feedback rows ClickHouse refused for good (malformed), quarantined to the spool's rejected files.",
    ["table"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_dropped_rows_total = Counter(
    "feedback_dropped_rows",
    "Feedback rows the store dropped: the memory buffer or the disk spool was full, or the disk "
    "failed (the topic sink reads them again from the log).",
    ["table", "reason"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
feedback_skipped_messages_total = Counter(
    "feedback_skipped_messages",
    "Messages the topic sink did not store because they do not decode (dead-lettered elsewhere).",
    ["topic"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)


gateway_requests_total = Counter(
    "gateway_requests",
    "Gateway calls by outcome (ok, client_closed, error, or the HTTP error code).",
    ["status"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
gateway_deciders_lost = Counter(
    "gateway_deciders_lost",
    "Episodes of a decider that failed (unreachable, or lost with calls in its hands): one per episode.",
    namespace=NAMESPACE,
    registry=REGISTRY,
)
gateway_added_seconds = Histogram(
    "gateway_added_seconds",
    "What the gateway adds to a streamed call's time to first token: its arrival to its first "
    "chunk written, less the engine's own time from the call sent to its first chunk.",
    buckets=(2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3, 15e-3, 20e-3, 50e-3, 100e-3, 1.0),
    namespace=NAMESPACE,
    registry=REGISTRY,
)
gateway_decision_seconds = Histogram(
    "gateway_decision_seconds",
    "From a gateway call's arrival to the scheduler's answer (tokenize, ask the worker, its answer).",
    buckets=(1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 250e-3, 1.0, 5.0),
    namespace=NAMESPACE,
    registry=REGISTRY,
)
gateway_connections_cut = Counter(
    "gateway_connections_cut",
    "Client connections the gateway closed on a bound (gateway/connections.py), by reason: "
    "header_timeout (a request's headers too slow), idle (no call within the idle timeout), "
    "over_cap (refused: the gateway held its maximum of connections).",
    ["reason"],
    namespace=NAMESPACE,
    registry=REGISTRY,
)
for _reason in ("header_timeout", "idle", "over_cap"):
    gateway_connections_cut.labels(reason=_reason)  # every reason shown from the start, at 0
gateway_connections_open = Gauge(
    "gateway_connections_open",
    "Client connections the gateway serves now (those refused over the cap are not counted).",
    namespace=NAMESPACE,
    registry=REGISTRY,
)


def render() -> bytes:
    """The registry in the Prometheus text format (serve with ``CONTENT_TYPE``)."""
    return generate_latest(REGISTRY)


def serve_metrics(port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` from a daemon thread; return the bound port (``port=0``: any free one).

    Loopback by default; pass ``addr="0.0.0.0"`` for a Prometheus server on another host.
    """
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    bound: int = server.server_address[1]
    return bound


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """``count`` observations of one ``value`` for the price of one: every request of a batch
    shares the batch's latency, and ``observe`` per request is a visible share of the worker's
    time per request (docs/results/speed.md). Reaches into prometheus_client's histogram (its
    ``_sum``, ``_upper_bounds``, ``_buckets``, as ``observe`` uses them);
    tests/unit/infra/test_prometheus.py checks it against ``observe``."""
    histogram._sum.inc(value * count)
    for bound, bucket in zip(histogram._upper_bounds, histogram._buckets, strict=True):
        if value <= bound:
            bucket.inc(count)
            return


REASON_CODES = frozenset(
    {"cannot_meet_slo", "over_quota", "no_capacity", "expired", "queue_full", "unknown_model"}
)


def reason_code(admission: AdmissionDecision) -> str:
    """The reject's reason code (the text before its first ':'), from a fixed set; '' otherwise."""
    if admission.action != "reject":
        return ""
    code = admission.reason.split(":", 1)[0].strip()
    return code if code in REASON_CODES else "other"


MAX_POOL_LABELS = 32
"""Distinct ``pool`` label values when no pools are configured (then ``other``)."""


class PrometheusTelemetry:
    """The agents' ``Telemetry`` port, recorded in the metrics above.

    ``pool`` labels come from the configured pools (``known_pools``), never from what a client
    wrote: any other model is ``other``. Without configured pools, the first ``MAX_POOL_LABELS``
    pools seen get their (64-character) name, the rest ``other``: a client cannot blow up the
    metrics' cardinality or size."""

    def __init__(self, known_pools: Collection[str] = ()) -> None:
        self.known_pools = frozenset(known_pools)
        self._labels: dict[str, str] = {}
        self._dc_labels: dict[str, str] = {}

    def pool_label(self, pool: str) -> str:
        label = self._labels.get(pool)
        if label is None:
            if self.known_pools:
                label = pool if pool in self.known_pools else "other"
            else:
                label = pool[:64] if len(self._labels) < MAX_POOL_LABELS else "other"
            if len(self._labels) < 4 * MAX_POOL_LABELS:  # the cache stays bounded too
                self._labels[pool] = label
        return label

    def dc_label(self, dc: str) -> str:
        """A DC's name (64 characters) for the first ``MAX_POOL_LABELS`` DCs seen, then ``other``:
        DC names come from the instances' heartbeats, bounded all the same."""
        label = self._dc_labels.get(dc)
        if label is None:
            label = dc[:64] if len(self._dc_labels) < MAX_POOL_LABELS else "other"
            if len(self._dc_labels) < 4 * MAX_POOL_LABELS:
                self._dc_labels[dc] = label
        return label

    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        """Counts per outcome once per batch, and per pool by action and reject reason; per
        routed request one sample of ``latency_s`` (its batch's arrival -> decisions sent), one
        of its policy time, and its wait since arrival."""
        for outcome, count in collections.Counter(o.admission.action for o in outcomes).items():
            decisions_total.labels(policy=policy, outcome=outcome).inc(count)
        now = time.time()
        answers = collections.Counter(
            (self.pool_label(o.request.model), o.admission.action, reason_code(o.admission)) for o in outcomes
        )
        for (pool, action, reason), count in answers.items():
            admissions_total.labels(pool=pool, action=action, reason=reason).inc(count)
        for o in outcomes:
            if o.admission.action == "admit":  # its wait in a queue pool (0 when admitted at once)
                admission_wait_seconds.labels(pool=self.pool_label(o.request.model)).observe(
                    max(now - o.request.ts, 0.0)
                )
        routed = [o.routing for o in outcomes if o.routing is not None]
        if routed:
            observe_many(decision_latency_seconds, latency_s, len(routed))
            # The router gives every request of a batch the same policy time (batch time / size).
            for value, count in collections.Counter(r.decision_latency_s for r in routed).items():
                observe_many(policy_latency_seconds, value, count)

    def dead_lettered(self, topic: str) -> None:
        dlq_total.labels(topic=topic).inc()

    def fleet_events(self, events: Sequence[FleetEvent]) -> None:
        for (kind, dc), count in collections.Counter((e.kind, self.dc_label(e.dc)) for e in events).items():
            fleet_events_total.labels(kind=kind, dc=dc).inc(count)
        for e in events:
            if e.kind == "replica_advice" and e.replicas is not None:
                desired_replicas.labels(pool=self.pool_label(e.model), dc=self.dc_label(e.dc)).set(e.replicas)

    def queue_depth(self, pool: str, depth: int) -> None:
        queue_depth.labels(pool=self.pool_label(pool)).set(depth)

    def placements_observed(self, pool: str, count: int) -> None:
        placements_observed_total.labels(pool=self.pool_label(pool)).inc(count)
