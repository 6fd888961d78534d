"""Who disaggregates what: TokenPilot by its latency model, llm-d and Dynamo by their rules."""

from __future__ import annotations

import zlib

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
    hashes = (
        blocks
        if blocks is not None
        else tuple(zlib.crc32(f"{rid}:{k}".encode()) for k in range(tokens // BLOCK_TOKENS))
    )
    return RequestView(rid, 1, "t", "m", "interactive", tokens, 200, hashes, 0.0)


def place(policy: object, request: RequestView, v: ClusterView) -> Placement:
    candidates = v.serving_rows(request) & v.reachable_rows()
    return policy.place([request], [candidates], v, 0.0)[0]  # type: ignore[attr-defined]


PD = ["prefill", "decode", "decode"]
HEAVY = [0, 500, 500]  # decode batches that stretch every prefill step on the decode instances
LONG = 21_000


def burst(pilot: TokenPilot, v: ClusterView, n: int, tokens: int = LONG) -> list[Placement]:
    """``n`` prompts arriving together: each decision queues its prefill where it goes."""
    return [place(pilot, ask(f"q{k}", tokens), v) for k in range(n)]


def test_tokenpilot_disaggregates_a_request_serving_whole_would_make_miss() -> None:
    (placement,) = burst(TokenPilot(), view(PD, HEAVY), 1)
    assert placement.prefill_instance == 0 and placement.instance in (1, 2)
    assert placement.predicted_ttft_s is not None and placement.predicted_ttft_s <= 2.0
    assert placement.reason.startswith("disaggregated")
    # on idle decode instances whole meets the objective: nothing to rescue
    assert burst(TokenPilot(), view(PD, [0, 0, 0]), 1)[0].prefill_instance == -1


def test_tokenpilot_keeps_it_whole_when_whole_meets_the_objective_though_a_pair_is_sooner() -> None:
    (placement,) = burst(TokenPilot(), view(PD, [0, 450, 450]), 1)
    assert placement.prefill_instance == -1
    assert placement.predicted_ttft_s is not None and placement.predicted_ttft_s < 2.0


def test_tokenpilot_prefills_locally_once_the_prefill_pool_is_busy() -> None:
    chosen = [p.prefill_instance for p in burst(TokenPilot(), view(PD, HEAVY), 6)]
    assert chosen[0] == 0 and chosen[-1] == -1  # its queue makes a pair miss as well


def test_tokenpilot_keeps_a_request_whole_without_a_link_or_a_prefill_instance() -> None:
    assert burst(TokenPilot(), view(PD, HEAVY, gbps=0.0), 1)[0].prefill_instance == -1
    assert burst(TokenPilot(), view(["decode"] * 3, HEAVY), 1)[0].prefill_instance == -1


def test_tokenpilot_keeps_it_whole_where_the_transfer_costs_more_than_it_saves() -> None:
    # a link a thousand times slower: the move alone takes a minute
    assert burst(TokenPilot(), view(PD, HEAVY, gbps=0.4), 1)[0].prefill_instance == -1


def test_tokenpilot_calibrates_on_the_prefill_leg_and_not_on_the_transfer() -> None:
    pilot, v = TokenPilot(), view(PD, HEAVY)
    (placement,) = burst(pilot, v, 1)
    theta = pilot.model_for("llama3-8b-h100").theta.copy()
    pilot.observe(PrefillDone("q0", 1, v.instance_ids[placement.prefill_instance], 0.9, 0.9))
    assert not np.array_equal(pilot.model_for("llama3-8b-h100").theta, theta)
    assert ("q0", 1) not in pilot._sent  # its later first token and end teach nothing


def test_tokenpilot_binds_the_decode_side_on_the_snapshot_of_the_moment() -> None:
    pilot = TokenPilot()
    (placement,) = burst(pilot, view(PD, HEAVY), 1)
    decided = f"i{placement.instance}"
    other = "i1" if decided == "i2" else "i2"
    # by the time the KV is ready, the decided instance is the busy one
    later = view(PD, [0, 500, 0] if decided == "i1" else [0, 0, 500], version=2)
    assert pilot.bind_decode(ask("q0", LONG), later, decided, 1.0) == other
    assert pilot.in_flight.requests[other] == 1 and pilot.in_flight.requests[decided] == 0
    assert pilot.bind_decode(ask("q0", LONG), later, "i9", 1.0) == "i9"  # unknown: as decided


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


def test_dynamo_disagg_routes_the_decode_side_again_after_the_prefill() -> None:
    dynamo, v = DynamoDisagg(), view(["prefill", "decode", "decode"], [0, 0, 0])
    placement = place(dynamo, ask("long", 24_000), v)
    decided = v.instance_ids[placement.instance]
    other = "i1" if decided == "i2" else "i2"
    for k in range(3):  # meanwhile the decided worker got other requests' decode blocks
        dynamo.active.add((f"x{k}", 1), decided, tuple(range(100 * k, 100 * k + 40)), 0, 0)
    assert dynamo.bind_decode(ask("long", 24_000), v, decided, 1.0) == other
    assert dynamo.in_flight.requests[other] == 1 and dynamo.in_flight.requests[decided] == 0
