"""Dynamo's router-side active-sequence accounting: in-flight prefill tokens and active blocks.

Follows ``ai-dynamo/dynamo`` ``lib/kv-router/src/sequences/single.rs`` at
04df1c42f2fedff2286f46f13efcc96ec32a55bd (``ActiveSequences``), with the shipped defaults of
``lib/kv-router/src/scheduling/config.rs`` at 0243c51bb6e8958be89df4978b5761677c9adc23 that
concern it: active-block and prefill-token tracking on, output blocks not tracked, no
prefill-load model (a prefill's tokens count in full until its first token). Used by
``DynamoKv`` (``dynamo.py``), whose docstring cites the selector it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agents.policy.common.numeric import IntArray
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.slots import SlotRegistry
from agents.policy.types import ClusterView


@dataclass(slots=True)
class _Active:
    slot: int
    blocks: tuple[int, ...]  # distinct prompt block hashes
    tail_tokens: int  # prompt tokens after the last full block
    prefill_tokens: int  # uncached tokens still counted as in-flight prefill (0 once done)


class ActiveSequences:
    """Per worker: the prefills this router sent and has not seen a first token for, and the
    distinct blocks of the requests it has in flight there (``ActiveSequences`` in
    ``ai-dynamo/dynamo`` ``lib/kv-router/src/sequences/single.rs``).

    - ``add``: the request's prompt blocks join the worker's active set (reference-counted: a
      block shared by two active requests counts once) and its uncached tokens join the
      worker's in-flight prefill (``PrefillLoadHint.initial_effective_prefill_tokens``).
    - ``prefill_done`` (first token): only the prefill tokens leave (``mark_prefill_completed``).
    - ``free`` (end of response): everything leaves.

    Per-worker totals live in numpy columns by slot (``SlotRegistry``), aligned with a view's rows.
    Which of a new request's blocks are already active on each worker comes from a
    ``PrefixIndex`` of the active sets: block hashes are chained, so the shared blocks are a
    prefix of the prompt and one ``match_array`` gives them for every worker.
    """

    def __init__(self) -> None:
        self.index = PrefixIndex()
        self._refs: list[dict[int, int]] = []  # slot -> block hash -> active requests holding it
        self._open: dict[tuple[str, int], _Active] = {}
        self._slots = SlotRegistry(
            {"prefill": (0, np.int64), "blocks": (0, np.int64), "tails": (0, np.int64)}
        )

    def add(
        self,
        key: tuple[str, int],
        instance_id: str,
        blocks: tuple[int, ...],
        tail_tokens: int,
        prefill_tokens: int,
    ) -> None:
        if key in self._open:
            return  # duplicate add: Dynamo ignores it too
        slot = self._slot(instance_id)
        distinct = tuple(dict.fromkeys(blocks))
        refs = self._refs[slot]
        new = []
        for block in distinct:
            count = refs.get(block, 0)
            if count == 0:
                new.append(block)
            refs[block] = count + 1
        if new:
            self.index.add(instance_id, new)
        c = self._slots.columns
        c["blocks"][slot] += len(new)
        c["tails"][slot] += tail_tokens
        c["prefill"][slot] += prefill_tokens
        self._open[key] = _Active(slot, distinct, tail_tokens, prefill_tokens)

    def prefill_done(self, key: tuple[str, int]) -> None:
        active = self._open.get(key)
        if active is not None and active.prefill_tokens:
            self._slots.columns["prefill"][active.slot] -= active.prefill_tokens
            active.prefill_tokens = 0

    def free(self, key: tuple[str, int]) -> None:
        self.prefill_done(key)
        active = self._open.pop(key, None)
        if active is None:
            return
        refs = self._refs[active.slot]
        gone = []
        for block in active.blocks:
            count = refs[block] - 1
            if count:
                refs[block] = count
            else:
                del refs[block]
                gone.append(block)
        if gone:
            self.index.remove(self._slots.ids[active.slot], gone)
        c = self._slots.columns
        c["blocks"][active.slot] -= len(gone)
        c["tails"][active.slot] -= active.tail_tokens

    def loads(self, view: ClusterView) -> tuple[IntArray, IntArray, IntArray]:
        """(in-flight prefill tokens, distinct active blocks, active tail tokens) per row."""
        out = [np.zeros(len(view), dtype=np.int64) for _ in range(3)]
        slots, rows = self._slots.rows(view)
        for arr, name in zip(out, ("prefill", "blocks", "tails"), strict=True):
            arr[rows] = self._slots.columns[name][slots]
        return out[0], out[1], out[2]

    def shared(self, blocks: tuple[int, ...], view: ClusterView) -> npt.NDArray[np.int64]:
        """Leading blocks of ``blocks`` already active on each row."""
        return self.index.match_array(blocks, view)

    def _slot(self, instance_id: str) -> int:
        slot = self._slots.get(instance_id)
        if slot is None:
            slot = self._slots.slot(instance_id)
            self._refs.append({})
        return slot
