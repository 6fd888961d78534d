"""``tokenfleet planner``: the planner process — its planner, its fleet file, its probes, its loop.

``serve`` runs the loop (``planner/service.py``) with the process's ``/metrics``, ``/health``
and ``/ready`` on ``Settings.http_host`` : ``Settings.planner_web_port``. ``/ready``: the state is
rebuilt from the topics and the broker answers, whether this process is the active planner or
waits (``tokenfleet_planner_active`` says which).

Which planner: ``build_planner(name, rules, profiles)`` of ``agents/policy/planners`` (the name
is passed through; ``check_planner`` names the known ones). Its interval: ``--interval``, else
``Settings.planner_interval_s``, else the planner's own ``interval_s``, else ``DEFAULT_INTERVAL_S``
(a planner that never replans, such as ``static``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Mapping
from pathlib import Path

from agents.policy import planners
from agents.policy.planners.contract import Planner, planned_objective
from infra.clickhouse.sink import met_slo
from infra.files import read_yaml
from infra.kafka.connection import KafkaConnection
from infra.probes import bound_port, start_probes
from infra.settings import Settings
from planner.fleet_state import FleetFacts, FleetFold, fleet_facts
from planner.service import PlannerCounts, PlannerOptions, planners_group, run_planner
from schemas.events import Completion
from sim.engine.profiles import get_profile
from sim.engine.profiling import profile_engine

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0
"""Seconds between plans of a planner that has no interval of its own (``static``)."""
STALE_HEARTBEATS = 20
"""An instance is taken for stopped after this many heartbeat intervals without one (at least 5 s)."""


def make_planner(
    name: str, facts: FleetFacts, settings: Settings, params: Mapping[str, str] | None = None
) -> Planner:
    """The planner called ``name`` (``build_planner``) with the fleet's rules; ``dynamo-sla``
    with Dynamo's profiling step run on the engine profile of each model version the fleet file
    names (``FleetFacts.engines``) at the interactive objective. ``ValueError`` (one line)
    naming the known planners, or what ``dynamo-sla`` lacks."""
    planners.check_planner(name)
    profiles = None
    if name == "dynamo-sla":
        ttft_s, tpot_s = planned_objective(settings.slo())
        profiles = {
            key: profile_engine(get_profile(engine), ttft_s, tpot_s) for key, engine in facts.engines.items()
        }
        if not profiles:
            raise ValueError(
                "dynamo-sla needs each model's engine profile: list instances with a profile, or give "
                "models.NAME.profile, in the fleet file (--fleet)"
            )
    return planners.build_planner(name, facts.rules, profiles, params)


def load_facts(path: Path | None) -> FleetFacts:
    """What the fleet file at ``path`` says (``FleetFacts``; none: nothing but the heartbeats);
    ``ValueError`` (one line) naming the file and what is wrong."""
    if path is None:
        return FleetFacts()
    doc = read_yaml(path, "fleet file")
    if not isinstance(doc, dict):
        raise ValueError(f"fleet file {str(path)!r} must be a mapping (data_centres, models, ...)")
    try:
        return fleet_facts(doc, lambda profile: get_profile(profile).gpus)
    except ValueError as exc:
        raise ValueError(f"fleet file {str(path)!r}: {exc}") from None


def plan_interval(settings: Settings, planner: Planner, override: float | None = None) -> float:
    """Seconds between plans (module docstring)."""
    for seconds in (override, settings.planner_interval_s, planner.interval_s):
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            return float(seconds)
    return DEFAULT_INTERVAL_S


def make_fold(settings: Settings, facts: FleetFacts) -> FleetFold:
    """The fold of the topics with the settings' objectives: completions judged as the store
    judges them (``met_slo``), the fleet planned for the ``interactive`` class, each DC's KV
    link from ``Settings.kv_link_gbps``."""
    classes = settings.slo()
    ttft_s, tpot_s = planned_objective(settings.slo())

    def met(completion: Completion) -> bool:
        return met_slo(completion, classes.get(completion.slo_class))

    return FleetFold(
        facts,
        met,
        stale_s=max(5.0, STALE_HEARTBEATS * settings.heartbeat_interval_s),
        memory_s=max(3600.0, settings.planner_history_s),
        slo_ttft_s=ttft_s,
        slo_tpot_s=tpot_s,
        kv_link_gbps=settings.kv_link_gbps,
    )


async def serve(
    settings: Settings,
    connection: KafkaConnection,
    planner: Planner,
    facts: FleetFacts,
    *,
    interval_s: float,
    stop: asyncio.Event | None = None,
) -> PlannerCounts:
    """Plan until cancelled, ``stop`` or SIGTERM (a clean stop leaves the planners' group: a
    waiting planner takes over at once), with the probes up meanwhile."""
    stop = stop or asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ready = asyncio.Event()
    probes = await start_probes(settings.http_host, settings.planner_web_port, ready.is_set)
    log.warning(
        "planner %s: every %g s; kafka %s; http://%s:%d/metrics, /health, /ready",
        planner.name, interval_s, connection, settings.http_host, bound_port(probes),
    )  # fmt: skip
    options = PlannerOptions(
        interval_s=interval_s,
        group_id=planners_group(settings.app_id),
        history_s=settings.planner_history_s,
        keepalive_intervals=settings.planner_keepalive_intervals,
        partitions=settings.topic_partitions,
        session_timeout_s=settings.broker_session_timeout_s,
        rebalance_timeout_s=settings.broker_rebalance_timeout_s,
        heartbeat_interval_s=settings.broker_heartbeat_interval_s,
    )
    try:
        return await run_planner(
            connection, planner, make_fold(settings, facts), options, stop=stop, ready=ready
        )
    finally:
        await probes.cleanup()
