"""The worker's wiring: settings in, one ``WorkerRuntime`` out. Each part is built by the module
whose one job it is; this module only composes them, in the order they need each other:

    Settings + KafkaConnection
      -> the Faust app and its topics (``streams.app.create_app``)
      -> the store, if any (``ClickHouseFeedback``) and the routing service, one scheduler
         per pool (``worker/scheduling.py``: ``make_scheduler``), with the decisions its
         previous process kept (``worker/decision_memory.py``)
      -> the Kafka readers (``worker/readers.py``): request lane, deciders' group membership,
         and, once the handlers exist, the shared log
      -> the handlers (``agents.handlers.SchedulerAgents``, ``agents.keeping.LogKeeper``) on the
         lane's publisher and Prometheus telemetry, bound to the app, the readers and the
         direct lane (``streams.binding.bind``)
      -> the store's feed from the log (``worker/store.py``) and the probes and pages
         (``worker/probes.py``)

The child (``worker/child.py``) runs the app and hands the runtime's health and decision
keeper to its ready marker and watchdog.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import faust

from agents.handlers import SchedulerAgents
from agents.keeping import LogKeeper
from infra import metrics
from infra.clickhouse.feedback import ClickHouseFeedback
from infra.kafka.broker import free_port
from infra.kafka.connection import KafkaConnection
from infra.prompts import Prompts
from infra.settings import Settings
from streams.app import create_app
from streams.binding import LanePublisher, bind
from streams.direct import DirectLane
from streams.snapshot import SnapshotCache
from worker import decision_memory
from worker.probes import Health, WorkerHealth, serve_probes
from worker.readers import deciders_membership, request_lane, shared_log
from worker.scheduling import dc_view, routing_service
from worker.store import feed_from_the_log


@dataclass(frozen=True, slots=True)
class WorkerRuntime:
    """A wired worker: what the child runs, closes, and reads while it runs."""

    app: faust.App  # every agent, task, reader and page bound; the child runs it
    store: ClickHouseFeedback | None  # the feedback store (None: ClickHouse off); closed last
    health: Health  # health(max_age_s) -> (consuming, status): worker.probes.WorkerHealth
    keep_decisions: Callable[[], None]  # writes what was decided for the next process


def build_worker(settings: Settings, connection: KafkaConnection, feedback: bool = True) -> WorkerRuntime:
    """The worker ``settings`` describe, on ``connection`` (module docstring: in what order).

    ``feedback=False`` turns off the ClickHouse store only: Prometheus telemetry is always on.
    The data directory is created if it does not exist (Faust keeps its state under it).
    ``ValueError`` (one line) for a policy, parameter or rules file that cannot be used."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app, channels = create_app(
        settings.app_id,
        connection,
        partitions=settings.topic_partitions,
        data_dir=settings.data_dir,
        web_port=settings.worker_web_port or free_port(),
        web_host=settings.http_host,
        rebalance_timeout_s=settings.broker_rebalance_timeout_s,
        session_timeout_s=settings.broker_session_timeout_s,
        heartbeat_interval_s=settings.broker_heartbeat_interval_s,
        fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
    )
    run_id = settings.run_id or f"{settings.app_id}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    store = ClickHouseFeedback.from_settings(settings, run_id) if feedback else None
    service = routing_service(settings, store, run_id)
    # What this worker's previous process decided, if it gave up after the broker lost its log.
    memory = settings.data_dir / decision_memory.FILE_NAME
    decision_memory.restore(service, memory)

    lane = request_lane(settings, connection, service.worker)
    membership = deciders_membership(settings, connection)
    publisher = LanePublisher(app, lane)
    telemetry = metrics.PrometheusTelemetry(settings.pools)
    agents = SchedulerAgents(
        service,
        SnapshotCache(dc_view(settings)),
        publisher,
        telemetry,
        Prompts.from_dirs(settings.tokenizer_dirs()),
    )
    shared = shared_log(settings, connection, agents, service.wants_holds)
    direct = DirectLane(agents, settings.direct_host, settings.direct_port, settings.direct_advertised_host)
    bind(
        app,
        channels,
        agents,
        LogKeeper(publisher, telemetry),
        lane,
        membership,
        shared,
        direct,
        settings.event_batch_size,
        settings.event_batch_window_s,
    )
    if store is not None:
        feed_from_the_log(app, settings, connection, store)
    health = WorkerHealth(lane, membership, shared)
    serve_probes(app, health)
    return WorkerRuntime(app, store, health, functools.partial(decision_memory.keep, service, memory))
