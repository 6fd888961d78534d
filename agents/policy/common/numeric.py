"""Array aliases, the block count of a token count, and the pickers every router shares."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agents.policy.types import BLOCK_TOKENS, BoolArray, FloatArray

__all__ = ["BoolArray", "FloatArray", "IntArray", "blocks_for", "pick_max", "pick_min"]

IntArray = npt.NDArray[np.int64]


def blocks_for(tokens: int) -> int:
    """Number of ``BLOCK_TOKENS`` blocks needed to hold ``tokens`` tokens (ceil)."""
    return -(-tokens // BLOCK_TOKENS)


def pick_min(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the lowest score among ``mask``; ties broken uniformly at random."""
    masked = np.where(mask, scores, np.inf)
    best = np.flatnonzero(masked <= masked.min() + 1e-12)
    return int(best[0] if len(best) == 1 else rng.choice(best))


def pick_max(scores: FloatArray, mask: BoolArray, rng: np.random.Generator) -> int:
    """Row with the highest score among ``mask``; ties broken uniformly at random."""
    return pick_min(-scores, mask, rng)
