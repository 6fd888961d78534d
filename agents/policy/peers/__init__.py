"""Peer routers, rebuilt from their released source so we can measure against them.

Each class cites the repository, commit and files it follows, uses the shipped defaults, states
its formula and lists what it still departs from (and why). ``LlmdLoadAware`` is a shipped but
non-default llm-d profile, ``SglangGatewayCacheAware`` the later SGLang gateway's variant of
the same policy; both labelled as such.
"""

from agents.policy.peers.dynamo import DynamoKv
from agents.policy.peers.llmd import LlmdDefault, LlmdLoadAware
from agents.policy.peers.sglang import SglangCacheAware, SglangGatewayCacheAware

__all__ = ["DynamoKv", "LlmdDefault", "LlmdLoadAware", "SglangCacheAware", "SglangGatewayCacheAware"]
