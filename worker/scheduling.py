"""What the worker decides with: its policy's parameters, one scheduler per pool, the routing
service around them.

``make_scheduler`` is the one place where the worker builds a pool's ``Scheduler``
(``agents.policy.build_scheduler``); ``routing_service`` hands it to the ``RoutingService``,
which calls it for each pool it meets.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any

from agents.policy import Scheduler, build_scheduler
from agents.policy.fleetmind.rules import parse_rules
from agents.policy.pools import HoldLimits
from agents.policy.registry import parse_policy, with_deployment
from agents.policy.slomax.controller import Step
from agents.policy.types import DcView
from agents.routing import RoutingService
from infra import metrics
from infra.clickhouse.feedback import ClickHouseFeedback
from infra.clickhouse.goodput import StoreGoodput
from infra.files import read_yaml
from infra.kafka.broker import deciders_group
from infra.settings import Settings


def dc_view(settings: Settings) -> DcView:
    """The configured data centres: their round trips from the ingress (0 for a DC not given
    one) and, when any DC has one, their KV links between prefill and decode instances (0 for
    a DC not given one)."""
    names = tuple(dict.fromkeys([*settings.dc_rtt_ms, *settings.kv_link_gbps]))
    rtts = tuple(settings.dc_rtt_ms.get(n, 0.0) / 1000 for n in names)
    links = tuple(settings.kv_link_gbps.get(n, 0.0) for n in names) if settings.kv_link_gbps else ()
    return DcView(names, rtts, (True,) * len(names), links)


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


def hold_limits(settings: Settings) -> HoldLimits:
    """How many requests a pool may hold, and for how long."""
    return HoldLimits(settings.hold_max_per_pool, settings.hold_timeout_s)


def make_scheduler(
    settings: Settings,
    params: dict[str, dict[str, Any]],
    store: ClickHouseFeedback | None,
    run_id: str,
    pool: str,
) -> Scheduler:
    """``pool``'s scheduler: ``settings.policy`` with ``params`` and the hold limits. With a
    store, an admission stage that closes a loop (SLOMax) reads the pool's goodput from it, and
    its steps are shown as Prometheus gauges and stored (under ``run_id``)."""
    scheduler = build_scheduler(settings.policy, params=params, hold=hold_limits(settings))
    if store is not None:
        source = StoreGoodput(store, settings.policy, run_id, pool)

        def record(step: Step) -> None:
            metrics.slomax_knob.labels(policy=settings.policy, knob="headroom").set(step.after.headroom)
            metrics.slomax_knob.labels(policy=settings.policy, knob="batch_share").set(step.after.batch_share)
            source.record(step)

        scheduler.bind_feedback(source, record)
    return scheduler


def routing_service(settings: Settings, store: ClickHouseFeedback | None, run_id: str) -> RoutingService:
    """The routing service of this worker process (named ``host:pid``), one scheduler per pool
    (``make_scheduler``); its decisions carry the deciders' group as the scheduler's name.
    ``ValueError`` (one line) for a policy, parameter or rules file that cannot be used."""
    params = policy_params(settings)
    return RoutingService(
        settings.policy,
        params=params,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        hold=hold_limits(settings),
        known_pools=settings.pools,
        make_scheduler=functools.partial(make_scheduler, settings, params, store, run_id),
        scheduler=deciders_group(settings.app_id),
        log_delay_s=settings.decision_log_delay_s,
    )
