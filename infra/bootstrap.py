"""The one bootstrap: settings in, a wired worker out (broker, app, agents, scheduler, stores).

Every entry point that runs the scheduler builds it here, so the wiring exists once:

    Settings -> Kafka connection (configured, with its TLS and SASL, or embedded Tansu)
             -> Faust app + channels (streams.app)
             -> RoutingService (agents.routing, the policy by name + parameters, FleetMind's
                rules from the fleet YAML)
             -> SchedulerAgents (agents.handlers) with the instance state (snapshot cache),
                the lane publisher and Prometheus telemetry; LogKeeper (agents.keeping) with
                the same publisher and telemetry
             -> bound to the app and the worker's readers (streams.binding): the request lane
                following the deciders' group (Membership), the shared log of state topics
             -> the ClickHouse feedback store, fed from the topics by the store's own consumer
                group (TopicSink), which commits offsets once the store has the rows
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust

from agents.handlers import SchedulerAgents
from agents.keeping import LogKeeper
from agents.policy import Scheduler, build_scheduler
from agents.policy.fleetmind.rules import parse_rules
from agents.policy.pipeline import HoldLimits
from agents.policy.registry import parse_policy, with_deployment
from agents.policy.slomax.controller import Step
from agents.policy.types import DcView
from agents.routing import RoutingService
from infra import decision_memory, metrics
from infra.clickhouse.feedback import ClickHouseFeedback
from infra.clickhouse.goodput import StoreGoodput
from infra.clickhouse.topic_sink import TopicSink, store_group
from infra.files import read_yaml
from infra.kafka.broker import deciders_group, embedded_broker, free_port
from infra.kafka.connection import KafkaConnection
from infra.prompts import Prompts
from infra.settings import Settings
from schemas import topics
from streams.app import create_app
from streams.binding import LanePublisher, bind
from streams.direct import DirectLane
from streams.handoff import Handoff
from streams.membership import Membership
from streams.request_lane import RequestLane
from streams.shared_log import SharedLog
from streams.snapshot import SnapshotCache

log = logging.getLogger(__name__)

HEALTH_MAX_AGE_S = 5.0  # /health: the lane's last answered fetch at most this old


@contextlib.contextmanager
def kafka_connection(settings: Settings) -> Iterator[KafkaConnection]:
    """The configured Kafka (its addresses, TLS and SASL: every client of the process is built
    from this one object), or an embedded Tansu broker, plaintext, for the duration of the
    block. ``ValueError`` (one line) when a TLS file cannot be used."""
    if settings.kafka_bootstrap:
        yield KafkaConnection.from_settings(settings)
        return
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with embedded_broker(log_path=settings.data_dir / "tansu.log") as bootstrap:
        yield KafkaConnection.from_settings(settings, bootstrap)


def dc_view(settings: Settings) -> DcView:
    """The configured data centres and their round trips from the ingress."""
    names = tuple(settings.dc_rtt_ms)
    rtts = tuple(settings.dc_rtt_ms[n] / 1000 for n in names)
    return DcView(names, rtts, (True,) * len(names))


def policy_params(settings: Settings) -> dict[str, dict[str, Any]]:
    """The stage parameters of the worker's policy: ``policy_params`` with the heartbeat interval
    and, for a ``fleetmind`` policy, the rules of ``fleet_rules`` (``with_deployment``; explicit
    parameters win). ``ValueError`` (one line) for a rules file that cannot be used."""
    rules = None
    if settings.fleet_rules is not None and parse_policy(settings.policy)[1] == "fleetmind":
        rules = load_fleet_rules(settings.fleet_rules)
    return with_deployment(settings.policy, settings.policy_params, settings.heartbeat_interval_s, rules)


def load_fleet_rules(path: Path) -> dict[str, Any]:
    """The fleet YAML document at ``path``, checked to be valid FleetMind rules (``parse_rules``);
    ``ValueError`` with one line saying what is wrong."""
    doc = read_yaml(path, "fleet rules")
    if not isinstance(doc, dict):
        raise ValueError(f"fleet rules {str(path)!r} must be a mapping (data_centres, tenants, models, ...)")
    try:
        parse_rules(doc)
    except ValueError as exc:
        raise ValueError(f"{str(path)!r}: {exc}") from None
    return doc


def build_worker_app(
    settings: Settings, connection: KafkaConnection, feedback: bool = True
) -> tuple[faust.App, Any]:
    """The Faust app with every agent bound; returns (app, feedback store or None).

    ``feedback=False`` turns off the ClickHouse sink only: Prometheus telemetry is always on.
    The data directory is created if it does not exist (Faust keeps its state under it).
    """
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
    params = policy_params(settings)
    store = ClickHouseFeedback.from_settings(settings, run_id) if feedback else None
    hold = HoldLimits(settings.hold_max_per_pool, settings.hold_timeout_s)

    def make_scheduler(pool: str) -> Scheduler:
        """A pool's scheduler; an admission stage that closes a loop (SLOMax) reads the pool's
        goodput from the store, and its steps are shown as Prometheus gauges and stored."""
        scheduler = build_scheduler(settings.policy, params=params, hold=hold)
        if store is not None:
            source = StoreGoodput(store, settings.policy, run_id, pool)

            def record(step: Step) -> None:
                metrics.slomax_knob.labels(policy=settings.policy, knob="headroom").set(step.after.headroom)
                metrics.slomax_knob.labels(policy=settings.policy, knob="batch_share").set(
                    step.after.batch_share
                )
                source.record(step)

            scheduler.bind_feedback(source, record)
        return scheduler

    service = RoutingService(
        settings.policy,
        params=params,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        hold=hold,
        known_pools=settings.pools,
        make_scheduler=make_scheduler,
        scheduler=deciders_group(settings.app_id),
    )
    # What this worker's previous process decided, if it gave up after the broker lost its log.
    memory = settings.data_dir / decision_memory.FILE_NAME
    restored = service.restore(decision_memory.load(memory))
    if restored:
        log.warning("worker: %d decisions of its previous process restored from %s", restored, memory)
    app.conf.tokenfleet_keep_decisions = lambda: decision_memory.save(memory, service.answers())
    handoff = Handoff(
        connection,
        topics.DECIDERS.name,
        deciders_group(settings.app_id),
        service.worker,
        stale_after_s=settings.broker_session_timeout_s,
    )
    lane = RequestLane(
        connection,
        topics.REQUESTS.name,
        group_id=f"{settings.app_id}-requests",
        replay_topic=topics.ADMISSION.name,
        fetch_max_wait_ms=settings.request_fetch_max_wait_ms,
        max_batch=settings.request_batch_max,
        handoff=handoff.released,
    )
    membership = Membership(
        connection,
        topics.REQUESTS.name,
        deciders_group(settings.app_id),
        session_timeout_s=settings.broker_session_timeout_s,
        rebalance_timeout_s=settings.broker_rebalance_timeout_s,
        heartbeat_interval_s=settings.broker_heartbeat_interval_s,
    )
    publisher = LanePublisher(app, lane)
    telemetry = metrics.PrometheusTelemetry(settings.pools)
    agents = SchedulerAgents(
        service,
        SnapshotCache(dc_view(settings)),
        publisher,
        telemetry,
        Prompts.from_dirs(settings.tokenizer_dirs()),
    )
    shared_topics = {
        topics.HEARTBEATS.name: agents.on_heartbeats,
        topics.KV_EVENTS.name: agents.on_kv_events,
        topics.FIRST_TOKENS.name: agents.on_first_tokens,
        topics.COMPLETIONS.name: agents.on_completions,
        topics.DECISIONS.name: agents.on_decisions,
    }
    if service.wants_holds:  # the other deciders' holds (SLOMax); not read where they change nothing
        shared_topics[topics.ADMISSION.name] = agents.on_admissions
    shared = SharedLog(
        connection,
        shared_topics,
        heartbeat_topic=topics.HEARTBEATS.name,
        fetch_max_wait_ms=settings.request_fetch_max_wait_ms,
    )
    keeper = LogKeeper(publisher, telemetry)
    direct = DirectLane(agents, settings.direct_host, settings.direct_port, settings.direct_advertised_host)
    bind(
        app,
        channels,
        agents,
        keeper,
        lane,
        membership,
        shared,
        direct,
        settings.event_batch_size,
        settings.event_batch_window_s,
    )

    if store is not None:
        sink = TopicSink(
            connection,
            store_group(settings.app_id),
            store,
            session_timeout_s=settings.broker_session_timeout_s,
            rebalance_timeout_s=settings.broker_rebalance_timeout_s,
            heartbeat_interval_s=settings.broker_heartbeat_interval_s,
            fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
            max_pending_rows=max(1, settings.feedback_buffer_rows // 2),
            revoke_grace_s=settings.feedback_commit_grace_s,
        )

        @app.task  # type: ignore[untyped-decorator]
        async def storing() -> None:
            """The store's consumer, for as long as the worker runs; stopped (its acknowledged
            offsets committed) before the store is closed (``worker/child.py``)."""
            await sink.start()
            try:
                await asyncio.Event().wait()  # until the worker stops and cancels this task
            finally:
                await sink.stop(settings.feedback_commit_grace_s)

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(metrics.render(), content_type="text/plain; version=0.0.4")

    def health(max_age_s: float = HEALTH_MAX_AGE_S) -> tuple[bool, dict[str, Any]]:
        """Consuming = a settled member of the deciders' group, the shared log read and answered
        within ``max_age_s``, and, if the group gave this worker partitions, the request lane
        reading them with its fetches answered as recently (a worker with no partitions is a
        ready standby: there are more workers than partitions). Also read by the watchdog."""
        lane_status = lane.status()
        highwater = {**shared.highwater(), **lane_status["highwater"]}
        lane_ok = lane.healthy(max_age_s) or not membership.partitions
        consuming = membership.settled_for() == 0.0 and shared.fresh(max_age_s) and lane_ok
        return consuming, {
            "consuming": consuming,
            "group_settled_for_s": round(membership.settled_for(), 3),
            "lane_partitions": lane_status["partitions"],
            "last_fetch_age_s": lane_status["last_fetch_age_s"],
            "highwater": highwater,
        }

    app.conf.tokenfleet_health = health

    @app.page("/health")
    async def health_page(web: Any, request: Any) -> Any:
        """Live: the worker's event loop answers."""
        return web.json({"live": True})

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        """Serving: the request lane reads partitions and the broker answers its fetches."""
        consuming, body = health()
        body.pop("highwater")
        return web.json(body, status=200 if consuming else 503)

    return app, store
