"""Prometheus metrics: names in the dedicated registry, text exposition, the HTTP endpoint."""

from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry, Histogram

from agents.routing import Routed
from infra import metrics
from schemas.events import AdmissionDecision, FleetEvent, InferenceRequest, RoutingDecision


def test_render_shows_every_metric_after_use() -> None:
    metrics.decisions_total.labels(policy="round-robin", outcome="routed").inc()
    metrics.decision_latency_seconds.observe(0.0003)
    metrics.queue_depth.labels(pool="llama3-8b").set(7)
    metrics.dlq_total.labels(topic="tf.requests").inc()
    metrics.feedback_rows_total.labels(table="completions").inc(3)
    text = metrics.render().decode()
    assert 'tokenfleet_decisions_total{outcome="routed",policy="round-robin"}' in text
    assert 'tokenfleet_decision_latency_seconds_bucket{le="0.0005"}' in text
    assert 'tokenfleet_decision_latency_seconds_bucket{le="0.02"}' in text
    assert 'tokenfleet_queue_depth{pool="llama3-8b"} 7.0' in text
    assert 'tokenfleet_dlq_total{topic="tf.requests"}' in text
    assert 'tokenfleet_feedback_rows_total{table="completions"}' in text


def test_serve_metrics_answers_on_the_bound_port() -> None:
    metrics.dlq_total.labels(topic="tf.completions").inc()
    port = metrics.serve_metrics(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'tokenfleet_dlq_total{topic="tf.completions"}' in body


def test_decided_batch_records_batch_latency_and_policy_time_per_routed_request() -> None:
    request = InferenceRequest(request_id="r1", model="m", input_tokens=10, output_budget=5)
    common = {"request_id": "r1", "model": "m", "slo_class": "interactive", "policy": "p"}
    routed = Routed(
        request,
        AdmissionDecision(**common, action="admit"),
        RoutingDecision(**common, dc="dc1", instance_id="i1", decision_latency_s=15e-6, request=request),
    )
    queued = Routed(request, AdmissionDecision(**common, action="queue"), None)

    def sample(name: str, le: str) -> float:
        value = metrics.REGISTRY.get_sample_value(f"tokenfleet_{name}_bucket", {"le": le})
        assert value is not None
        return value

    before = (sample("decision_latency_seconds", "0.015"), sample("decision_latency_seconds", "0.01"))
    policy_before = sample("policy_latency_seconds", "2e-05")
    metrics.PrometheusTelemetry().decided_batch("p", [routed, queued], latency_s=0.012)
    # one routed request: one sample of 12 ms (in the 15 ms bucket, not the 10 ms one) ...
    assert sample("decision_latency_seconds", "0.015") == before[0] + 1
    assert sample("decision_latency_seconds", "0.01") == before[1]
    # ... and one of its 15 µs in the policy
    assert sample("policy_latency_seconds", "2e-05") == policy_before + 1


def test_observe_many_equals_repeated_observe() -> None:
    def histogram(name: str) -> Histogram:
        return Histogram(name, "test", buckets=(0.001, 0.01, 0.1), registry=CollectorRegistry())

    one_by_one, at_once = histogram("one_by_one"), histogram("at_once")
    for value, count in ((0.0005, 3), (0.005, 2), (0.05, 4), (5.0, 1), (0.01, 2)):
        for _ in range(count):
            one_by_one.observe(value)
        metrics.observe_many(at_once, value, count)

    def samples(h: Histogram, name: str) -> list[tuple[str, str, float]]:
        """(suffix, labels, value) of every sample but the creation time."""
        return [
            (s.name.removeprefix(name), str(s.labels), round(s.value, 9))
            for family in h.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        ]

    assert samples(at_once, "at_once") == samples(one_by_one, "one_by_one")
    assert ("_count", "{}", 12.0) in samples(at_once, "at_once")
    assert ("_bucket", "{'le': '0.01'}", 7.0) in samples(at_once, "at_once")  # 3 + 2 + 2 (le)


def test_pool_labels_come_from_the_configured_pools_never_from_clients() -> None:
    configured = metrics.PrometheusTelemetry(["llama3-8b"])
    assert configured.pool_label("llama3-8b") == "llama3-8b"
    assert configured.pool_label("x" * 100_000) == "other"
    anything = metrics.PrometheusTelemetry()
    labels = {anything.pool_label(f"client-{i}-" + "y" * 500) for i in range(1000)}
    assert len(labels) == metrics.MAX_POOL_LABELS + 1 and "other" in labels
    assert max(len(label) for label in labels) <= 64


def test_fleet_events_are_counted_by_kind_and_a_bounded_dc_label() -> None:
    def count(kind: str, dc: str) -> float:
        value = metrics.REGISTRY.get_sample_value("tokenfleet_fleet_events_total", {"kind": kind, "dc": dc})
        return value or 0.0

    before = count("dc_down", "dc-prom"), count("dc_up", "dc-prom")
    telemetry = metrics.PrometheusTelemetry()
    telemetry.fleet_events(
        [FleetEvent(kind="dc_down", dc="dc-prom", model="m")] * 2
        + [FleetEvent(kind="dc_up", dc="dc-prom", model="m")]
    )
    assert (count("dc_down", "dc-prom"), count("dc_up", "dc-prom")) == (before[0] + 2, before[1] + 1)
    labels = {telemetry.dc_label(f"dc-{i}-" + "z" * 500) for i in range(200)}
    assert len(labels) == metrics.MAX_POOL_LABELS and "other" in labels  # dc-prom took one
    assert max(len(label) for label in labels) <= 64


def test_replica_advice_sets_the_desired_replicas_an_autoscaler_reads() -> None:
    telemetry = metrics.PrometheusTelemetry()
    telemetry.fleet_events(
        [
            FleetEvent(kind="replica_advice", dc="dc-r", model="m-r", delta=1, replicas=3),
            FleetEvent(kind="dc_up", dc="dc-r", model="m-r"),  # not advice: no change
        ]
    )
    desired = metrics.REGISTRY.get_sample_value("tokenfleet_desired_replicas", {"pool": "m-r", "dc": "dc-r"})
    assert desired == 3.0
    telemetry.fleet_events([FleetEvent(kind="replica_advice", dc="dc-r", model="m-r", delta=-1, replicas=2)])
    assert (
        metrics.REGISTRY.get_sample_value("tokenfleet_desired_replicas", {"pool": "m-r", "dc": "dc-r"}) == 2.0
    )
