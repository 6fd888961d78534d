"""Peer routers, rebuilt from their released source so we can measure against them.

Each class cites the repository, commit and files it follows, uses the shipped defaults, states
its formula and lists what it still departs from (and why). ``LlmdLoadAware`` is a shipped but
non-default llm-d profile, ``LlmdDefault4k`` llm-d's default profile at its older defaults
(4 096-token prefix cap), ``SglangGatewayCacheAware`` the later SGLang gateway's variant of
the same policy; all labelled as such. ``LlmdPrecise`` and ``SmgEvents`` are the event-driven
modes of llm-d and of SGLang's gateway (``lightseekorg/smg``), fed the engines' KV events.
``LlmdPd`` and ``DynamoDisagg`` are their prefill/decode disaggregation (``disagg.py``).
"""

from agents.policy.peers.disagg import DynamoDisagg, LlmdPd
from agents.policy.peers.dynamo import DynamoKv
from agents.policy.peers.llmd import LlmdDefault, LlmdDefault4k, LlmdLoadAware, LlmdPrecise
from agents.policy.peers.sglang import SglangCacheAware, SglangGatewayCacheAware
from agents.policy.peers.smg import SmgEvents

__all__ = [
    "DynamoDisagg",
    "DynamoKv",
    "LlmdDefault",
    "LlmdDefault4k",
    "LlmdLoadAware",
    "LlmdPd",
    "LlmdPrecise",
    "SglangCacheAware",
    "SglangGatewayCacheAware",
    "SmgEvents",
]
