"""The pure decision core: numpy and plain data only (no Kafka, no ClickHouse, no simulator).

``build_scheduler(name, seed, params)`` builds a ``Scheduler`` (admission -> DC selection ->
instance selection) for a policy name such as ``tokenpilot`` or ``pass-through+home-dc+dynamo-kv``;
see ``agents/policy/registry.py``. The seam is ``agents/policy/types.py``, the stage contracts
``agents/policy/stages.py``.
"""

from __future__ import annotations

from agents.policy.pipeline import Scheduler
from agents.policy.registry import PolicyError, build_scheduler, policy_names

__all__ = ["PolicyError", "Scheduler", "build_scheduler", "policy_names"]
