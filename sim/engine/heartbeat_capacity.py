"""An engine group's capacity as its heartbeats tell it, for the calibration
(``sim/engine/calibration.py``): ``kv_tokens``, ``kv_block_tokens``, ``max_seqs`` and
``prefill_budget_tokens``.

Capacity, from the heartbeats (``HeartbeatSummary``): ``kv_tokens`` = the largest
``kv_blocks_total`` times the block size; ``kv_block_tokens`` (the engine's KV allocation unit) =
the block size the heartbeats carry, if they carry one, else the prior's; ``prefill_budget_tokens``
(the tokens one step computes, vLLM's ``max_num_batched_tokens``) = the one the heartbeats
declare (their deployment's), else the prior's; ``max_seqs`` = the one the heartbeats declare
(vLLM's ``max_num_seqs``), else the most requests seen running, if that exceeds the prior's, or
if a seat limit held requests waiting at that many running (``HeartbeatSummary.seat_limited``),
else the prior's. A seat limit: at least ``SEAT_LIMIT_BEATS`` heartbeats saw that many running
while others waited and the KV cache had room (free blocks for another request the size of an
average running one), and they are at least ``SEAT_LIMIT_SHARE`` of the beats that saw that many
running while others waited. The share, because a seat limit holds requests waiting with KV room
on nearly every beat at the limit, where a full KV cache shows room only on a few borderline
beats (room for the average running request, not for the larger one waiting next).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agents.policy.types import BLOCK_TOKENS
from sim.engine.profiles import EngineProfile

SEAT_LIMIT_BEATS = 3
SEAT_LIMIT_SHARE = 0.5
"""A seat limit is taken from the heartbeats when at least ``SEAT_LIMIT_BEATS`` beats at the most
requests running had others waiting and KV room, and they are at least ``SEAT_LIMIT_SHARE`` of
the beats at the most running with others waiting (module docstring)."""


@dataclass(frozen=True, slots=True)
class HeartbeatSummary:
    """What a group's heartbeats say of its capacity: the largest ``kv_blocks_total`` (0: no
    heartbeat), the most requests seen ``running``, how many beats saw that many running
    while others waited and KV blocks were free (``beats_at_seat_limit``), the engines' KV
    block size in tokens (``kv_block_tokens``; 0: the heartbeats do not say), and how many beats
    saw that many running while others waited, KV room or not (``beats_waiting_at_most``). Not
    given (0, or fewer than ``beats_at_seat_limit``), it is taken as ``beats_at_seat_limit``:
    every such beat had room, and the seat limit is taken on ``SEAT_LIMIT_BEATS`` beats alone.
    ``max_seqs`` / ``prefill_budget_tokens``: the scheduler's limits the heartbeats declare
    (0: they do not say)."""

    kv_blocks_total: int = 0
    max_running: int = 0
    beats_at_seat_limit: int = 0
    kv_block_tokens: int = 0
    beats_waiting_at_most: int = 0
    max_seqs: int = 0
    prefill_budget_tokens: int = 0

    @property
    def waiting_at_most(self) -> int:
        """``beats_waiting_at_most``, or ``beats_at_seat_limit`` where that is not given."""
        return max(self.beats_waiting_at_most, self.beats_at_seat_limit)

    @property
    def seat_limited(self) -> bool:
        """Whether a seat limit held requests waiting at ``max_running`` (module docstring):
        ``SEAT_LIMIT_BEATS`` beats or more with KV room, and at least ``SEAT_LIMIT_SHARE`` of the
        beats waiting at the most running."""
        room = self.beats_at_seat_limit
        return (
            self.max_running > 0
            and room >= SEAT_LIMIT_BEATS
            and room >= SEAT_LIMIT_SHARE * self.waiting_at_most
        )


def with_capacity(prior: EngineProfile, beats: HeartbeatSummary | None) -> EngineProfile:
    """``prior`` with the capacity its heartbeats tell (module docstring)."""
    if beats is None or beats.kv_blocks_total <= 0:
        return prior
    seats = prior.max_seqs
    if beats.max_seqs > 0:
        seats = beats.max_seqs
    elif beats.max_running > seats or beats.seat_limited:
        seats = beats.max_running
    unit = beats.kv_block_tokens if usable_unit(beats.kv_block_tokens) else prior.kv_block_tokens
    return replace(
        prior,
        kv_tokens=beats.kv_blocks_total * BLOCK_TOKENS,
        max_seqs=seats,
        kv_block_tokens=unit,
        prefill_budget_tokens=beats.prefill_budget_tokens or prior.prefill_budget_tokens,
    )


def usable_unit(tokens: int) -> bool:
    """A block size the simulator can allocate in: a divisor of the prefix blocks' size."""
    return 0 < tokens <= BLOCK_TOKENS and BLOCK_TOKENS % tokens == 0


def capacity_messages(prior: EngineProfile, beats: HeartbeatSummary | None) -> list[str]:
    if beats is None or beats.kv_blocks_total <= 0:
        fields = "kv_tokens, max_seqs, kv_block_tokens and prefill_budget_tokens"
        return [f"no heartbeats: {fields} are the prior's"]
    messages = []
    if beats.prefill_budget_tokens <= 0:
        messages.append(
            "prefill_budget_tokens: the heartbeats do not declare the engines' step budget "
            f"(vLLM's max_num_batched_tokens): kept the prior's {prior.prefill_budget_tokens}"
        )
    if beats.max_seqs <= 0 and beats.max_running <= prior.max_seqs and not beats.seat_limited:
        room = f"{beats.beats_at_seat_limit} of {beats.waiting_at_most}"
        messages.append(
            f"max_seqs: the engines never ran into a seat limit ({room} beats with requests waiting"
            f" at the most running had KV room): kept the prior's {prior.max_seqs}"
        )
    kept = f"kept the prior's {prior.kv_block_tokens}"
    if beats.kv_block_tokens <= 0:
        messages.append(f"kv_block_tokens: the heartbeats do not carry the engines' KV block size: {kept}")
    elif not usable_unit(beats.kv_block_tokens):
        unit = f"the engines' {beats.kv_block_tokens}-token blocks"
        messages.append(f"kv_block_tokens: {unit} do not divide {BLOCK_TOKENS}: {kept}")
    return messages
