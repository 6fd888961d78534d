"""The fault scenarios, one module each, in the order the suite runs them.

A scenario is an async function of a fresh ``lab.faults.harness.Run``: it starts the stack's
parts in the order its fault needs, sends traffic, injects the fault, sets the run's fault
window (``window``, ``fault_start``, ``fault_end``) and adds figures of its own to ``extra``;
the suite closes the run and counts the figures. Its docstring says what it does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from lab.faults.gateway_harness import GatewayScenario
from lab.faults.harness import Run
from lab.faults.scenarios.baseline import baseline
from lab.faults.scenarios.broker_restart import broker_restart
from lab.faults.scenarios.decider_failover import decider_failover
from lab.faults.scenarios.decider_join import decider_join
from lab.faults.scenarios.dispatcher_kill import dispatcher_kill
from lab.faults.scenarios.fuzz import fuzz
from lab.faults.scenarios.gateway_broker_restart import gateway_broker_restart
from lab.faults.scenarios.gateway_decider_kill import gateway_decider_kill
from lab.faults.scenarios.gateway_dispatcher_kill import gateway_dispatcher_kill
from lab.faults.scenarios.gateway_engine_kill import gateway_engine_kill
from lab.faults.scenarios.gateway_kill import gateway_kill
from lab.faults.scenarios.gateway_slow_clients import gateway_slow_clients
from lab.faults.scenarios.gateway_two_deciders import gateway_two_deciders
from lab.faults.scenarios.gateway_vllm_engine_kill import gateway_vllm_engine_kill
from lab.faults.scenarios.held_restart import held_restart
from lab.faults.scenarios.poison import poison
from lab.faults.scenarios.store_down_at_start import store_down_at_start
from lab.faults.scenarios.store_down_mid_run import store_down_mid_run
from lab.faults.scenarios.worker_kill import worker_kill

Scenario = Callable[[Run], Awaitable[None]]

SCENARIOS: dict[str, Scenario | GatewayScenario | None] = {
    "baseline": baseline,
    "fuzz": fuzz,
    "poison": poison,
    "worker_kill": worker_kill,
    "decider_failover": decider_failover,
    "decider_join": decider_join,
    "dispatcher_kill": dispatcher_kill,
    "store_down_at_start": store_down_at_start,
    "store_down_mid_run": store_down_mid_run,
    "held_restart": held_restart,
    "broker_restart": broker_restart,
    # The gateway path (lab.faults.gateway_harness): a stack as `tokenfleet up` starts it.
    "gateway_engine_kill": gateway_engine_kill,
    "gateway_decider_kill": gateway_decider_kill,
    "gateway_two_deciders": gateway_two_deciders,
    "gateway_kill": gateway_kill,
    "gateway_dispatcher_kill": gateway_dispatcher_kill,
    "gateway_slow_clients": gateway_slow_clients,
    "gateway_broker_restart": gateway_broker_restart,
    "gateway_vllm_engine_kill": gateway_vllm_engine_kill,
}
"""Name -> scenario (a ``GatewayScenario``: run by ``lab.faults.gateway_harness``); ``None``:
listed but not run (why: ``NOTES``)."""
NOTES: dict[str, str] = {}  # scenario -> why it is not run
