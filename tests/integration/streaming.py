"""Helpers for tests that run real worker processes against the session's embedded broker.

The stack's parts are the lab's (``lab.stack``): the worker process, the heartbeat of an idle
instance, publishing, and the collector of one topic's values by key. Topics are shared by the
whole session, so every test uses a model pool (the message key) and request ids of its own and
filters what it reads by them.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from lab.stack import ValueCollector as Collector
from lab.stack import WorkerOptions, heartbeat, publish, start_worker
from lab.worker_process import WorkerProcess
from schemas.events import InferenceRequest

__all__ = ["ROOT", "Collector", "heartbeat", "publish", "request", "unique", "worker"]

ROOT = Path(__file__).resolve().parents[2]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def worker(
    bootstrap: str,
    app_id: str,
    data_dir: Path,
    clickhouse: str = "off",
    settings: dict[str, str] | None = None,
) -> WorkerProcess:
    """A worker subprocess with its own app id (consumer group) and data dir, any free port. The
    session's broker is shared by tests that each run their own scheduler on purpose: unless
    ``settings`` say otherwise, it starts beside the others' (no refusal of a second scheduler)."""
    options = WorkerOptions(
        app_id=app_id,
        clickhouse=clickhouse,
        web_port=0,
        policy="least-request",
        env={"TOKENFLEET_REFUSE_OTHER_SCHEDULERS": "false", **(settings or {})},
        loglevel="info",
    )
    return start_worker(bootstrap, data_dir, options)


def request(pool: str, request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id, model=pool, input_tokens=1000, output_budget=128, prompt_block_hashes=(1, 2)
    )
