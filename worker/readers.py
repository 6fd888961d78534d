"""The worker's own Kafka readers, built from the settings (``streams/binding.py`` says how they
work together): the request lane with its hand-off fence, the membership of the deciders'
group, and the shared log of the state topics. Each reads on a consumer of its own
(``streams.clients.ConsumerLoop``); the store's reader is in ``worker/store.py``.
"""

from __future__ import annotations

from agents.handlers import SchedulerAgents
from infra.kafka.broker import deciders_group
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from schemas import topics
from streams.handoff import Handoff
from streams.membership import Membership
from streams.request_lane import RequestLane
from streams.shared_log import BatchHandler, SharedLog


def request_lane(settings: Settings, connection: KafkaConnection, worker: str) -> RequestLane:
    """``tf.requests`` read in batches, the partitions the deciders' group gives this worker;
    a new partition is read once its previous owner let go of it (``streams.handoff``: the
    other deciders' announcements, ``worker`` being this one's name)."""
    handoff = Handoff(
        connection,
        topics.DECIDERS.name,
        deciders_group(settings.app_id),
        worker,
        stale_after_s=settings.broker_session_timeout_s,
    )
    return RequestLane(
        connection,
        topics.REQUESTS.name,
        group_id=f"{settings.app_id}-requests",
        replay_topic=topics.ADMISSION.name,
        fetch_max_wait_ms=settings.request_fetch_max_wait_ms,
        max_batch=settings.request_batch_max,
        handoff=handoff.released,
    )


def deciders_membership(settings: Settings, connection: KafkaConnection) -> Membership:
    """This worker's membership of the deciders' group: which partitions of ``tf.requests`` are
    its own."""
    return Membership(
        connection,
        topics.REQUESTS.name,
        deciders_group(settings.app_id),
        session_timeout_s=settings.broker_session_timeout_s,
        rebalance_timeout_s=settings.broker_rebalance_timeout_s,
        heartbeat_interval_s=settings.broker_heartbeat_interval_s,
    )


def shared_log(
    settings: Settings, connection: KafkaConnection, agents: SchedulerAgents, wants_holds: bool
) -> SharedLog:
    """Every partition of the state topics, each handed to its handler of ``agents``; the other
    deciders' holds (``tf.admission``) only when the policy counts them (``wants_holds``:
    SLOMax), since elsewhere they change nothing."""
    handlers: dict[str, BatchHandler] = {
        topics.HEARTBEATS.name: agents.on_heartbeats,
        topics.KV_EVENTS.name: agents.on_kv_events,
        topics.FIRST_TOKENS.name: agents.on_first_tokens,
        topics.COMPLETIONS.name: agents.on_completions,
        topics.DECISIONS.name: agents.on_decisions,
    }
    if wants_holds:
        handlers[topics.ADMISSION.name] = agents.on_admissions
    return SharedLog(
        connection,
        handlers,
        heartbeat_topic=topics.HEARTBEATS.name,
        fetch_max_wait_ms=settings.request_fetch_max_wait_ms,
    )
