"""Peer routers, rebuilt from their public descriptions so we can measure against them.

Each class states the rule it implements and where the rule is described. They are faithful to
the decision rule, not to every engineering detail of the original (which is written in Rust or
Go and runs beside a real proxy).
"""

from agents.policy.peers.dynamo import DynamoKv
from agents.policy.peers.llmd import LlmdDefault
from agents.policy.peers.sglang import SglangCacheAware

__all__ = ["DynamoKv", "LlmdDefault", "SglangCacheAware"]
