"""Who disaggregates what: TokenPilot by its latency model, llm-d and Dynamo by their rules."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.peers import DynamoDisagg, LlmdPd
from agents.policy.tokenpilot import TokenPilot
from agents.policy.types import BLOCK_TOKENS, ClusterView, DcView, Placement, PrefillDone, RequestView

pytestmark = pytest.mark.unit


def view(roles: list[str], running: list[int], gbps: float = 400.0, version: int = 1) -> ClusterView:
    """Rows in DC A (link ``gbps``), each decoding ``running`` requests of 4 000 tokens."""
    n = len(roles)
    names = np.array(["m"] * n)
    tokens = np.array([r * 4000 for r in running], dtype=np.int64)
    return ClusterView(
        version, tuple(f"i{k}" for k in range(n)), np.array(["A"] * n), names, np.array(["1"] * n),
        np.array(["llama3-8b-h100"] * n), np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64),
        np.array(running, dtype=np.int64), tokens, np.array([r * 8 for r in running], dtype=np.int64),
        np.full(n, 4000, dtype=np.int64), np.zeros(n),
        dcs=DcView(("A",), (0.0,), (True,), (gbps,)),
        role=np.array(roles), kv_bytes_per_token=np.full(n, 128 * 1024, dtype=np.int64),
    )  # fmt: skip


def ask(rid: str, tokens: int, blocks: tuple[int, ...] | None = None) -> RequestView:
    hashes = blocks if blocks is not None else tuple(hash((rid, k)) for k in range(tokens // BLOCK_TOKENS))
    return RequestView(rid, 1, "t", "m", "interactive", tokens, 200, hashes, 0.0)


def place(policy: object, request: RequestView, v: ClusterView) -> Placement:
    candidates = v.serving_rows(request) & v.reachable_rows()
    return policy.place([request], [candidates], v, 0.0)[0]  # type: ignore[attr-defined]


BUSY_PD = (["prefill", "decode", "decode"], [0, 250, 250])  # decode steps near the TPOT objective


def test_tokenpilot_prefills_a_long_prompt_apart_when_its_decodes_would_pay_for_it() -> None:
    placement = place(TokenPilot(), ask("long", 24_000), view(*BUSY_PD))
    assert placement.prefill_instance == 0 and placement.instance in (1, 2)
    assert placement.reason.startswith("disaggregated")


def test_tokenpilot_keeps_a_request_whole_without_a_link_or_a_prefill_instance() -> None:
    assert place(TokenPilot(), ask("long", 24_000), view(*BUSY_PD, gbps=0.0)).prefill_instance == -1
    both = view(["decode", "decode", "decode"], [0, 120, 120])
    assert place(TokenPilot(), ask("long", 24_000), both).prefill_instance == -1


def test_tokenpilot_keeps_it_whole_where_the_transfer_costs_more_than_it_saves() -> None:
    idle = view(["prefill", "decode"], [0, 0])
    assert place(TokenPilot(), ask("short", 1_500), idle).prefill_instance == -1
    busy = (["prefill", "decode", "decode"], [0, 150, 150])
    assert place(TokenPilot(), ask("long", 24_000), view(*busy)).prefill_instance == 0
    # the same long prompt over a link a thousand times slower
    assert place(TokenPilot(), ask("long", 24_000), view(*busy, gbps=0.4)).prefill_instance == -1


def test_tokenpilot_prefills_locally_once_the_prefill_pool_is_busy() -> None:
    pilot, v = TokenPilot(), view(["prefill", "decode", "decode"], [0, 150, 150])
    # the prefill instance's queue grows with each request sent there
    pairs = [place(pilot, ask(f"q{k}", 24_000), v).prefill_instance for k in range(30)]
    assert pairs[0] == 0 and -1 in pairs


def test_tokenpilot_calibrates_on_the_prefill_leg_and_not_on_the_transfer() -> None:
    pilot, v = TokenPilot(), view(*BUSY_PD)
    request = ask("long", 24_000)
    placement = place(pilot, request, v)
    theta = pilot.model_for("llama3-8b-h100").theta.copy()
    pilot.observe(PrefillDone("long", 1, v.instance_ids[placement.prefill_instance], 0.9, 0.9))
    assert not np.array_equal(pilot.model_for("llama3-8b-h100").theta, theta)
    assert request.key not in pilot._sent  # its later first token and end teach nothing


def test_llmd_pd_disaggregates_at_sixteen_uncached_tokens_unless_cached_on_the_decode_pod() -> None:
    v = view(["prefill", "decode"], [0, 0])
    assert place(LlmdPd(), ask("a", 600), v).prefill_instance == 0
    assert (
        place(LlmdPd(), RequestView("s", 1, "t", "m", "interactive", 12, 5, (), 0.0), v).prefill_instance
        == -1
    )
    llmd, doc = LlmdPd(), ask("doc", 8 * BLOCK_TOKENS)
    place(llmd, doc, v)  # the prompt is recorded under both pods
    again = RequestView("b", 1, "t", "m", "interactive", 8 * BLOCK_TOKENS + 10, 5, doc.block_hashes, 0.0)
    assert place(llmd, again, v).prefill_instance == -1  # 10 uncached tokens on the decode pod
    assert place(LlmdPd(), ask("a", 600), view(["decode", "decode"], [0, 0])).prefill_instance == -1


def test_dynamo_disagg_bypasses_only_a_short_and_mostly_cached_prompt() -> None:
    v = view(["prefill", "decode"], [0, 0])
    assert place(DynamoDisagg(), ask("a", 1_000), v).prefill_instance == 0  # short but all uncached
    dynamo = DynamoDisagg()
    doc = ask("doc", 8 * BLOCK_TOKENS)
    dynamo.index.add("i1", doc.block_hashes)  # the decode worker's KV events hold the document
    again = RequestView("b", 1, "t", "m", "interactive", 8 * BLOCK_TOKENS + 300, 5, doc.block_hashes, 0.0)
    assert place(dynamo, again, v).prefill_instance == -1
    assert place(DynamoDisagg(), ask("long", 24_000), v).prefill_instance == 0
