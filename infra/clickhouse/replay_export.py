"""One run read back from the store as a replay's input: its workload and the fleet that served it.

``export_run(client, run_id, since_ts, until_ts)`` returns a ``RunExport``:

- ``records``: the workload, one Mooncake-format record per request (what
  ``sim/workloads/trace.py`` loads), ordered by arrival. A request is its ``request_id``: its
  attempts are one record, at its first attempt's arrival. Retries are the client's doing (it
  gave up, or the gateway tried another engine) and the replay's client model makes them again,
  so they are not requests of their own. Fields:

  - ``timestamp``: ms from the first exported request's arrival (the arrival window
    ``[since_ts, until_ts)`` selects requests by their first arrival);
  - ``input_length``: the prompt's tokens (as the request carried them; for a request published
    with its prompt's text only, as the decider counted them, else as the engine reported them);
  - ``output_length``: the output tokens of its ``ok`` completion; a request that never completed
    (rejected, held until it expired, aborted, timed out, failed) has no true length, and its
    output budget stands in for it;
  - ``hash_ids``: its prompt's block-hash chain as stored (the request's, else the one its
    routing decision carried). A request whose chain is missing (an old row, or a request
    rejected before a decider hashed its text) but whose prompt has full 512-token blocks gets
    one id per block that no other block of the file has, so it shares nothing: it replays
    without prefix reuse, and ``unhashed`` counts it;
  - ``request_id``, ``max_tokens`` (its output budget), ``tenant``, ``task_type``, ``model``; and
    when known ``slo_class`` (the class it declared, else the one its decider gave it),
    ``deadline_s`` (its deadline after its first arrival; one already past: ``EXPIRED_DEADLINE_S``),
    ``home_dc``, ``model_version``, ``allowed_regions``;
  - ``prefix_tail``, when its engine reused more of its prompt than whole blocks of its chain
    (vLLM matches prefixes in blocks of 16 or 32 tokens): see ``_PrefixTails``;
  - ``session_id`` and ``think_s``, the closed loop of its client (``sim/loop/sessions.py``), for
    a call that named its session (the gateway's hash of the tenant and the caller's session
    or OpenAI ``user``): a call that arrived after the end of its session's previous call (in
    arrival order; that call's last completion) was sent ``think_s`` = that gap after it, so the
    replay sends it that long after the replayed end and a faster policy gets the next call
    sooner, as the recorded users would have. A call that overlapped its predecessor, or whose
    predecessor never completed or was left out, has no ``think_s`` and arrives at its recorded
    time; so do calls without a session (rows from before sessions were stored).

  A request whose prompt size the store never learnt (text only, rejected before it was counted,
  no completion) cannot be replayed: it is left out and counted in ``unsized``.

- ``fleet``: a fleet YAML document (``sim/engine/fleet.py`` ``fleet_from_doc``): the instances
  that heartbeated in the run (inside the window, when one is given), each as its last heartbeat
  describes it, grouped by data centre, model, version, profile, GPUs and price, with their
  ``count``. ``profile`` is the engine profile the heartbeats named: a name the simulator does
  not know (a real engine's ``vllm``) needs the profile ``tokenfleet replay calibrate`` fits.
  ``gpus`` is per instance (informative: the profile sets what the simulator counts);
  ``price_per_hour`` null means the instances had no price (as in the fleet format).

Two aggregated queries (requests joined with their decisions and completions; heartbeats), no
query per request. Nothing of a prompt's text is read: the store holds none.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client

from agents.policy.types import BLOCK_TOKENS

FAR_FUTURE_MS = 2**62
"""``until`` when none is given: every arrival is before it."""
EXPIRED_DEADLINE_S = 0.001
"""``deadline_s`` of a request whose deadline had passed when it arrived (the format needs > 0)."""
UNSHARED_ID_BASE = -(2**63)
"""The ids given to the blocks of requests without a stored chain: from here upwards, each once."""


class ExportError(ValueError):
    """The run cannot be exported: unknown, no requests in the window, or no heartbeats."""


@dataclass(frozen=True, slots=True)
class RunExport:
    records: list[dict[str, Any]]
    fleet: dict[str, Any]
    instances: int
    unhashed: int
    unsized: int


# Every aggregate below ignores repeated rows (min, max, argMin, argMax, countIf > 0), so the
# tables are read without FINAL: a redelivered event that has not collapsed yet changes nothing.
_REQUESTS_SQL = """
WITH
    arrivals AS (
        SELECT
            request_id,
            min(toUnixTimestamp64Milli(ts)) AS arrival_ms,
            argMin(
                (tenant, model, task_type, slo_class, output_budget, toUnixTimestamp64Milli(deadline_ts),
                 allowed_regions, home_dc, model_version, session_id),
                (attempt, ts)
            ) AS first,
            max(input_tokens) AS input_tokens,
            argMax(prompt_block_hashes, length(prompt_block_hashes)) AS hashes
        FROM requests
        WHERE run_id = {run:String}
        GROUP BY request_id
        HAVING arrival_ms >= {since_ms:Int64} AND arrival_ms < {until_ms:Int64}
    ),
    routed AS (
        SELECT
            request_id,
            max(input_tokens) AS input_tokens,
            argMax(prompt_block_hashes, length(prompt_block_hashes)) AS hashes,
            argMin(slo_class, ts) AS slo_class
        FROM routing_decisions
        WHERE run_id = {run:String} AND ts >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
        GROUP BY request_id
    ),
    admitted AS (
        SELECT request_id, argMin(slo_class, ts) AS slo_class
        FROM admission_decisions
        WHERE run_id = {run:String} AND ts >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
        GROUP BY request_id
    ),
    ended AS (
        SELECT
            request_id,
            countIf(status = 'ok') > 0 AS completed,
            maxIf(output_tokens, status = 'ok') AS output_tokens,
            countIf(status = 'ok' AND attempt = 1) > 0 AS first_try_ok,
            maxIf(cached_tokens, status = 'ok' AND attempt = 1) AS first_try_cached,
            max(input_tokens) AS input_tokens,
            max(toUnixTimestamp64Milli(ts)) AS end_ms
        FROM completions
        WHERE run_id = {run:String} AND ts >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
        GROUP BY request_id
    )
SELECT
    arrivals.request_id,
    arrivals.arrival_ms,
    arrivals.first,
    multiIf(arrivals.input_tokens > 0, arrivals.input_tokens,
            routed.input_tokens > 0, routed.input_tokens, ended.input_tokens) AS input_tokens,
    if(notEmpty(arrivals.hashes), arrivals.hashes, routed.hashes) AS hashes,
    if(admitted.slo_class != '', admitted.slo_class, routed.slo_class) AS decided_class,
    ended.completed,
    ended.output_tokens,
    ended.first_try_ok,
    ended.first_try_cached,
    if(ended.request_id = '', NULL, ended.end_ms) AS end_ms
FROM arrivals
LEFT JOIN routed ON routed.request_id = arrivals.request_id
LEFT JOIN admitted ON admitted.request_id = arrivals.request_id
LEFT JOIN ended ON ended.request_id = arrivals.request_id
ORDER BY arrivals.arrival_ms, arrivals.request_id
"""

_FLEET_SQL = """
SELECT last.1 AS dc, last.2 AS model, last.3 AS version, last.4 AS profile, last.5 AS gpus,
       last.6 AS price, count() AS instances
FROM (
    SELECT instance_id, argMax((dc, model, model_version, profile, gpus, price_per_hour), ts) AS last
    FROM heartbeats
    WHERE run_id = {run:String}
      AND ts >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
      AND ts < fromUnixTimestamp64Milli({until_ms:Int64}, 'UTC')
    GROUP BY instance_id
)
GROUP BY dc, model, version, profile, gpus, price
ORDER BY dc, model, version, profile, gpus, price
"""


def export_run(
    client: Client, run_id: str, since_ts: float | None = None, until_ts: float | None = None
) -> RunExport:
    """The workload and fleet of run ``run_id`` (requests arriving in ``[since_ts, until_ts)``,
    Unix seconds; None: unbounded). Raises ``ExportError`` for an unknown run, a window without
    requests, or a run without heartbeats (the store keeps heartbeats 7 days)."""
    window = {
        "run": run_id,
        "since_ms": 0 if since_ts is None else int(since_ts * 1000),
        "until_ms": FAR_FUTURE_MS if until_ts is None else int(until_ts * 1000),
    }
    rows = client.query(_REQUESTS_SQL, parameters=window).result_rows
    if not rows:
        known = client.query(
            "SELECT count() FROM requests WHERE run_id = {run:String}", parameters=window
        ).result_rows[0][0]
        if not known:
            raise ExportError(f"no run {run_id!r} in the store (no request carries that run_id)")
        raise ExportError(f"run {run_id!r} has no request arriving in the window given")
    records, unhashed, unsized = _records(rows)
    if not records:
        raise ExportError(f"run {run_id!r}: no request of the window has a known prompt size")
    groups = client.query(_FLEET_SQL, parameters=window).result_rows
    if not groups:
        raise ExportError(
            f"run {run_id!r} has no heartbeats in the window (the store keeps them 7 days): "
            "no fleet to export"
        )
    fleet, instances = _fleet(groups)
    return RunExport(records, fleet, instances, unhashed, unsized)


def _records(rows: Sequence[Sequence[Any]]) -> tuple[list[dict[str, Any]], int, int]:
    """The Mooncake records of the request rows (by arrival), and the counts of those exported
    without a chain (``unhashed``) and of those left out for want of a prompt size (``unsized``)."""
    records: list[dict[str, Any]] = []
    unhashed = unsized = 0
    next_unshared = UNSHARED_ID_BASE
    start_ms: int | None = None  # the first exported arrival
    ends: dict[str, int | None] = {}  # session -> the end of its latest call so far (None: unknown)
    tails = _PrefixTails()
    for (
        request_id,
        arrival_ms,
        first,
        input_tokens,
        hashes,
        decided_class,
        completed,
        ok_tokens,
        first_try_ok,
        first_try_cached,
        end_ms,
    ) in rows:
        tenant, model, task_type, slo_class, budget, deadline_ms, regions, home_dc, version, session = first
        previous_end = ends.get(session)
        if input_tokens < 1:
            unsized += 1
            ends[session] = None  # the next call cannot follow one the workload leaves out
            continue
        ends[session] = end_ms
        blocks = input_tokens // BLOCK_TOKENS
        if not hashes and blocks:
            hashes = list(range(next_unshared, next_unshared + blocks))
            next_unshared += blocks
            unhashed += 1
        start_ms = arrival_ms if start_ms is None else start_ms
        record: dict[str, Any] = {
            "timestamp": arrival_ms - start_ms,
            "request_id": request_id,
            "input_length": input_tokens,
            "output_length": max(1, ok_tokens) if completed else budget,
            "hash_ids": list(hashes),
            "max_tokens": budget,
            "tenant": tenant,
            "task_type": task_type,
            "model": model,
        }
        if slo_class or decided_class:
            record["slo_class"] = slo_class or decided_class
        if deadline_ms is not None:
            record["deadline_s"] = max(EXPIRED_DEADLINE_S, (deadline_ms - arrival_ms) / 1000.0)
        if home_dc:
            record["home_dc"] = home_dc
        if version:
            record["model_version"] = version
        if regions:
            record["allowed_regions"] = list(regions)
        if session:
            record["session_id"] = session
            if previous_end is not None and arrival_ms >= previous_end:
                record["think_s"] = (arrival_ms - previous_end) / 1000.0
        records.append(record)
        tails.add(record, first_try_cached if first_try_ok else None)
    tails.fill()
    return records, unhashed, unsized


class _PrefixTails:
    """The ``prefix_tail`` of each record (``sim/workloads/trace.py``): its ``shared`` leading
    blocks (those an earlier record of the file has, in arrival order) and the tokens after them
    an engine with finer blocks than 512 tokens also reused: the rest of an earlier prompt's
    shared part of the next block, and past it what the engine kept of an earlier call's answer
    (a chat's next turn carries it), which a prompt's chain, known only at its arrival, cannot
    name. Measured where the engine reported ``cached`` tokens reaching past those blocks on the
    call's first attempt (a retry may find its own first attempt's prefill): ``cached - shared
    * 512``; elsewhere (the call went where its prefix was not, was retried, or never completed)
    the median measured after the same prefix (its ``shared``-th chained hash), if any was. A
    record sharing no block gets none: nothing says where a tail before the first block would
    be held."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self._measured: dict[int, list[int]] = {}  # prefix (last shared hash) -> tails measured after it
        self._unmeasured: list[tuple[dict[str, Any], int, int]] = []  # (record, shared, prefix)

    def add(self, record: dict[str, Any], cached: int | None) -> None:
        chain = record["hash_ids"][: record["input_length"] // BLOCK_TOKENS]
        shared = 0
        while shared < len(chain) and chain[shared] in self._seen:
            shared += 1
        self._seen.update(chain)
        if not shared:
            return
        prefix = chain[shared - 1]
        if cached is not None and cached >= shared * BLOCK_TOKENS:
            tail = cached - shared * BLOCK_TOKENS
            self._measured.setdefault(prefix, []).append(tail)
            _set_tail(record, shared, tail)
        else:
            self._unmeasured.append((record, shared, prefix))

    def fill(self) -> None:
        for record, shared, prefix in self._unmeasured:
            if prefix in self._measured:
                _set_tail(record, shared, statistics.median_low(self._measured[prefix]))


def _set_tail(record: dict[str, Any], shared: int, tail: int) -> None:
    room = record["input_length"] - shared * BLOCK_TOKENS
    if min(tail, room) > 0:
        record["prefix_tail"] = [shared, min(tail, room)]


def _fleet(groups: Sequence[Sequence[Any]]) -> tuple[dict[str, Any], int]:
    """The fleet document of the instance groups (ordered by data centre), and its instances."""
    data_centres: dict[str, list[dict[str, Any]]] = {}
    total = 0
    for dc, model, version, profile, gpus, price, count in groups:
        group: dict[str, Any] = {"count": int(count), "profile": profile, "model": model}
        if version:
            group["version"] = version
        group["gpus"] = int(gpus)
        group["price_per_hour"] = None if price is None else float(price)
        data_centres.setdefault(dc, []).append(group)
        total += int(count)
    doc = {"data_centres": [{"name": dc, "instances": listed} for dc, listed in data_centres.items()]}
    return doc, total
