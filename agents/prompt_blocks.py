"""Chained hashes of a prompt's 512-token blocks, from its token ids: the prefix-cache key.

``h_0 = H(ROOT, t[0:512])``, ``h_i = H(h_{i-1}, t[512 i : 512 (i+1)])``, full blocks only, with
``H`` the 64-bit BLAKE2b of the parent hash (8 bytes, little-endian) and the block's token ids
(4 bytes each, little-endian), read as a signed int64. Equal hash at position i means an equal
prefix up to the end of block i. Stable across processes and machines (unlike Python's salted
``hash``): the scheduler hashing a request and the engine adapter hashing what an engine cached
(``dispatcher/engines/vllm/kv_events.py``) must agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from agents.policy.types import BLOCK_TOKENS

ROOT = 0
"""The parent of a prompt's first block."""


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """``H(parent, tokens)`` (see the module docstring)."""
    digest = hashlib.blake2b(
        parent.to_bytes(8, "little", signed=True) + np.asarray(tokens, dtype="<u4").tobytes(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little", signed=True)


def chained_block_hashes(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """The chained hash of every full ``block_tokens`` block of ``token_ids``, in order."""
    hashes: list[int] = []
    parent = ROOT
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = block_hash(parent, token_ids[start : start + block_tokens])
        hashes.append(parent)
    return tuple(hashes)
