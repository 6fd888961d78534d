"""The worker's wiring: one typed runtime, the probes on the app, the data directory made."""

from __future__ import annotations

from pathlib import Path

from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from worker.wiring import build_worker


def test_the_worker_app_creates_its_data_directory(tmp_path: Path) -> None:
    """Without a store nothing else creates it, and Faust keeps its state there."""
    data = tmp_path / "not" / "there" / "yet"
    settings = Settings(data_dir=data, clickhouse_dsn="off", worker_web_port=0)
    runtime = build_worker(settings, KafkaConnection.plaintext("127.0.0.1:1"), feedback=False)
    assert data.is_dir() and runtime.store is None and runtime.app.conf.id == settings.app_id


def test_a_worker_that_has_not_started_is_not_consuming_and_keeps_no_decisions_yet(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, clickhouse_dsn="off", worker_web_port=0)
    runtime = build_worker(settings, KafkaConnection.plaintext("127.0.0.1:1"), feedback=False)
    consuming, status = runtime.health(5.0)
    assert not consuming and status["consuming"] is False
    assert status["lane_partitions"] == [] and status["last_fetch_age_s"] is None
    assert status["group_settled_for_s"] > 0  # no assignment yet
    runtime.keep_decisions()  # for the next process: none decided
    assert (tmp_path / "decided.jsonl").read_text() == ""
    assert {"/metrics", "/health", "/ready"} <= {page.rstrip("/") for page in runtime.app.web.views}
