"""Prometheus metrics: names in the dedicated registry, text exposition, the HTTP endpoint."""

from __future__ import annotations

import urllib.request

from infra import metrics


def test_render_shows_every_metric_after_use() -> None:
    metrics.decisions_total.labels(policy="round-robin", outcome="routed").inc()
    metrics.decision_latency_seconds.observe(0.0003)
    metrics.queue_depth.labels(pool="llama3-8b").set(7)
    metrics.dlq_total.labels(topic="tf.requests").inc()
    metrics.feedback_rows_total.labels(table="completions").inc(3)
    text = metrics.render().decode()
    assert 'tokenfleet_decisions_total{outcome="routed",policy="round-robin"}' in text
    assert 'tokenfleet_decision_latency_seconds_bucket{le="5e-05"}' in text
    assert 'tokenfleet_decision_latency_seconds_bucket{le="0.0005"}' in text
    assert 'tokenfleet_queue_depth{pool="llama3-8b"} 7.0' in text
    assert 'tokenfleet_dlq_total{topic="tf.requests"}' in text
    assert 'tokenfleet_feedback_rows_total{table="completions"}' in text


def test_serve_metrics_answers_on_the_bound_port() -> None:
    metrics.dlq_total.labels(topic="tf.completions").inc()
    port = metrics.serve_metrics(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'tokenfleet_dlq_total{topic="tf.completions"}' in body
