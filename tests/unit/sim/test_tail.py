"""``sim.evaluation.tail``: lost prompt caches told apart by cause, on hand-built fleets."""

from __future__ import annotations

from dataclasses import replace

from sim.evaluation.tail import LOST_TOKENS, analyse
from sim.loop.config import SimConfig
from tests.unit.sim.helpers import LLAMA, fleet_of, request, workload

BLOCKS = LOST_TOKENS // 512  # a prompt this long, once lost, counts
CHAIN_A = list(range(1, BLOCKS + 1))
CHAIN_B = list(range(1001, 1001 + BLOCKS))
CONFIG = SimConfig(seed=0, output_budget=4)
END = request("end", 20.0, 1024, 4, [9001, 9002])
"""The last arrival closes the measurement window (it is not judged itself)."""


def test_a_prefix_evicted_everywhere_is_lost_to_capacity() -> None:
    """One instance with room for 1.125 long prompts: B evicts most of A, so A's next turn
    finds a few blocks, where ideal (unlimited cache) finds all of A."""
    chain_a, chain_b = list(range(1, 2 * BLOCKS + 1)), list(range(1001, 1001 + 2 * BLOCKS))
    small = replace(LLAMA, kv_tokens=(2 * BLOCKS + BLOCKS // 4) * 512)
    trace = workload(
        request("a", 0.0, 2 * BLOCKS * 512, 4, chain_a),
        request("b", 5.0, 2 * BLOCKS * 512, 4, chain_b),
        request("a2", 10.0, (2 * BLOCKS + 1) * 512, 4, [*chain_a, 5000]),
        END,
    )
    tail = analyse(trace, fleet_of(1, small), "round-robin", CONFIG)
    assert tail.requests == 3  # a, b, a2
    assert (tail.lost_to_capacity, tail.lost_to_routing) == (1, 0)
    assert LOST_TOKENS <= tail.lost_tokens <= 2 * BLOCKS * 512
    assert tail.rerouted_ttft_s == tail.ttft_s  # nothing a placement could have won back


def test_a_prefix_held_by_another_instance_is_lost_to_routing() -> None:
    """Round-robin sends A's second turn to the instance that never saw A."""
    trace = workload(
        request("a", 0.0, BLOCKS * 512, 4, CHAIN_A),
        request("a2", 10.0, (BLOCKS + 1) * 512, 4, [*CHAIN_A, 5000]),
        END,
    )
    tail = analyse(trace, fleet_of(2), "round-robin", CONFIG)
    assert (tail.lost_to_capacity, tail.lost_to_routing) == (0, 1)
    assert tail.lost_tokens == BLOCKS * 512
    # Restored, A's second turn prefills one block, not 17: the slowest request gets faster.
    assert tail.rerouted_ttft_s["p99"] < tail.ttft_s["p99"]  # type: ignore[operator]
    assert tail.restored_ttft_s == tail.rerouted_ttft_s


def test_a_prefix_tail_lost_to_routing_counts_with_its_blocks() -> None:
    """A's second turn reuses 300 tokens past A's blocks where A ran (``prefix_tail``): sent
    elsewhere, it loses those too, the bound and the cause alike."""
    trace = workload(
        request("a", 0.0, BLOCKS * 512 + 400, 4, CHAIN_A),
        request("a2", 10.0, (BLOCKS + 1) * 512, 4, [*CHAIN_A, 5000], prefix_tail=(BLOCKS, 300)),
        END,
    )
    tail = analyse(trace, fleet_of(2), "round-robin", CONFIG)
    assert (tail.lost_to_capacity, tail.lost_to_routing) == (0, 1)
    assert tail.lost_tokens == BLOCKS * 512 + 300


def test_a_router_that_follows_the_cache_loses_nothing_and_copies_are_counted() -> None:
    """``tokenpilot`` sends A's second turn where A is; duplication is measured from the
    engines' caches: A on both instances (round-robin) is half of the resident blocks."""
    trace = workload(
        request("a", 0.0, BLOCKS * 512, 4, CHAIN_A),
        request("a2", 10.0, (BLOCKS + 1) * 512, 4, [*CHAIN_A, 5000]),
        END,
    )
    tail = analyse(trace, fleet_of(2), "tokenpilot", CONFIG)
    assert (tail.lost_to_capacity, tail.lost_to_routing, tail.lost_tokens) == (0, 0, 0)
    copies = analyse(
        workload(
            request("a", 0.0, BLOCKS * 512, 4, CHAIN_A),
            request("a-again", 10.0, BLOCKS * 512, 4, CHAIN_A),
            END,
        ),
        fleet_of(2),
        "round-robin",
        CONFIG,
        sample_every=3,  # sampled when END is decided: A on both instances
    )
    assert copies.duplication == 0.5
