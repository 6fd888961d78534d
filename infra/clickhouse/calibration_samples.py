"""What the calibration of one run's engines reads from the store (``tokenfleet replay
calibrate``; the fit itself is ``sim/engine/calibration.py``).

Per engine group (the model and profile the instances' newest heartbeats name; an instance that
never heartbeat is grouped by its completions' model, profile unknown): its ended attempts
(``completions``, each read once with ``FINAL``) as columns, and what its heartbeats say of its
capacity. Two queries, both filtered on ``run_id``:

- the completions: instance, arrival, TTFT, TPOT, E2E, end (the completion's time), tokens in,
  cached and out, and whether it ended ok; times as epoch seconds to the millisecond (the store
  keeps ``DateTime64(3)``), a missing duration as NaN;
- the heartbeats, one row per instance: model, profile, GPUs and price (of its newest beat that
  has one), the largest ``kv_blocks_total``, the most requests seen running, and how many beats
  saw that many running while others waited and its free KV blocks would have held another
  request the size of an average running one (a seat limit, not a full cache, held them), the
  engines' own KV block size, and how many beats saw that many running while others waited, KV
  room or not (the share of those with room tells a seat limit from a full cache:
  ``sim/engine/calibration.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from clickhouse_connect.driver.client import Client

_COMPLETIONS_SQL = """
SELECT
    instance_id,
    model,
    toUnixTimestamp64Milli(arrival_ts),
    ifNull(ttft_s, nan),
    ifNull(tpot_s, nan),
    ifNull(e2e_s, nan),
    toUnixTimestamp64Milli(ts),
    input_tokens,
    cached_tokens,
    output_tokens,
    status = 'ok'
FROM completions FINAL
WHERE run_id = {run:String}
"""

_HEARTBEATS_SQL = """
SELECT
    h.instance_id,
    argMax(h.model, h.ts),
    argMax(h.profile, h.ts),
    max(h.gpus),
    argMaxIf(h.price_per_hour, h.ts, h.price_per_hour IS NOT NULL),
    max(h.kv_blocks_total),
    any(top.most),
    countIf(
        h.running = top.most AND h.waiting > 0
        AND h.kv_blocks_total - h.kv_blocks_used >= h.kv_blocks_used / h.running
    ),
    max(h.kv_block_tokens),
    countIf(h.running = top.most AND h.waiting > 0),
    max(h.max_seqs),
    max(h.prefill_budget_tokens)
FROM heartbeats AS h
INNER JOIN (
    SELECT instance_id, max(running) AS most FROM heartbeats WHERE run_id = {run:String} GROUP BY instance_id
) AS top ON h.instance_id = top.instance_id
WHERE h.run_id = {run:String}
GROUP BY h.instance_id
"""

COLUMNS = (
    "instance",
    "model",
    "arrival_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "end_s",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "ok",
)
"""The completions' columns as read (``model`` aside, those of ``sim.engine.calibration.Observations``)."""


@dataclass(frozen=True, slots=True)
class GroupSamples:
    """One engine group of a run: ``model`` and ``profile`` ("" when no heartbeat named one),
    its ``instances``, their GPUs and price (None: none), its ended attempts (``completions``:
    ``COLUMNS`` but ``model``, numpy arrays of one length), and its heartbeats' largest
    ``kv_blocks_total`` (0: none), most requests seen running and beats at that seat limit
    (others waiting, KV room), their engines' KV block size in tokens (``kv_block_tokens``; 0: the
    heartbeats did not say), the beats at the most running with others waiting, KV room or
    not (``beats_waiting_at_most``; 0: not counted), and the scheduler's limits the heartbeats
    declare (``max_seqs``, ``prefill_budget_tokens``; 0: they did not)."""

    model: str
    profile: str
    instances: tuple[str, ...]
    gpus: int
    price_per_hour: float | None
    completions: dict[str, np.ndarray]
    kv_blocks_total: int
    max_running: int
    beats_at_seat_limit: int
    kv_block_tokens: int = 0
    beats_waiting_at_most: int = 0
    max_seqs: int = 0
    prefill_budget_tokens: int = 0

    @property
    def attempts(self) -> int:
        return len(self.completions["arrival_s"])


def calibration_samples(client: Client, run_id: str) -> list[GroupSamples]:
    """The engine groups of run ``run_id`` that ended attempts, in order of model and profile."""
    parameters = {"run": run_id}
    result = client.query(_COMPLETIONS_SQL, parameters=parameters)
    raw = dict(zip(COLUMNS, result.result_columns, strict=True)) if result.result_rows else {}
    beats = {row[0]: row[1:] for row in client.query(_HEARTBEATS_SQL, parameters=parameters).result_rows}
    if not raw:
        return []
    columns = {
        "instance": np.asarray(raw["instance"], dtype=str),
        "arrival_s": np.asarray(raw["arrival_s"], dtype=float) / 1000,
        "ttft_s": np.asarray(raw["ttft_s"], dtype=float),
        "tpot_s": np.asarray(raw["tpot_s"], dtype=float),
        "e2e_s": np.asarray(raw["e2e_s"], dtype=float),
        "end_s": np.asarray(raw["end_s"], dtype=float) / 1000,
        "input_tokens": np.asarray(raw["input_tokens"], dtype=np.int64),
        "cached_tokens": np.asarray(raw["cached_tokens"], dtype=np.int64),
        "output_tokens": np.asarray(raw["output_tokens"], dtype=np.int64),
        "ok": np.asarray(raw["ok"], dtype=bool),
    }
    models = np.asarray(raw["model"], dtype=str)
    group_of: dict[str, tuple[str, str]] = {}
    for instance, first in zip(*np.unique(columns["instance"], return_index=True), strict=True):
        beat = beats.get(str(instance))
        group_of[str(instance)] = (str(beat[0]), str(beat[1])) if beat else (str(models[first]), "")
    groups = []
    for key in sorted(set(group_of.values())):
        members = tuple(sorted(i for i, g in group_of.items() if g == key))
        mask = np.isin(columns["instance"], members)
        rows = [beats[i] for i in members if i in beats]
        most = max((int(r[5]) for r in rows), default=0)
        prices = [float(r[3]) for r in rows if r[3] is not None]
        groups.append(
            GroupSamples(
                model=key[0],
                profile=key[1],
                instances=members,
                gpus=max((int(r[2]) for r in rows), default=1),
                price_per_hour=prices[0] if prices else None,
                completions={name: values[mask] for name, values in columns.items()},
                kv_blocks_total=max((int(r[4]) for r in rows), default=0),
                max_running=most,
                beats_at_seat_limit=sum(int(r[6]) for r in rows if int(r[5]) == most),
                kv_block_tokens=max((int(r[7]) for r in rows), default=0),
                beats_waiting_at_most=sum(int(r[8]) for r in rows if int(r[5]) == most),
                max_seqs=max((int(r[9]) for r in rows), default=0),
                prefill_budget_tokens=max((int(r[10]) for r in rows), default=0),
            )
        )
    return groups
