"""Workloads: the requests of a trace, as the simulator knows them (true output length included).

Loaders:
- Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (512-token block ids, equal prefixes have equal ids); optional ``tenant``, ``slo_class``,
  ``deadline_s`` (seconds after arrival), ``max_tokens``, ``task_type``, ``model``.
- Azure LLM inference CSV: ``TIMESTAMP, ContextTokens, GeneratedTokens``; no prefix
  information, so every block is unique to its request.

Block hashes are chained (hash of the previous chained hash and the block id), so equal hash at
position i means the whole prefix up to block i is equal. Only full blocks are hashed: a partial
last block is never shared, as in vLLM.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from agents.policy.common.slo import classify
from agents.policy.types import BLOCK_TOKENS

DEFAULT_OUTPUT_BUDGET = 2048


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload. ``output_tokens`` is the truth: the simulator's, never a policy's."""

    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    tenant: str = "default"
    slo_class: str = "interactive"
    deadline_s: float | None = None
    max_tokens: int | None = None
    task_type: str = "chat"
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: tuple[TraceRequest, ...]

    def scaled(self, rate_scale: float) -> Workload:
        """The same requests arriving ``rate_scale`` times as fast (deadlines unchanged)."""
        if rate_scale <= 0:
            raise ValueError("--rate-scale must be > 0")
        if rate_scale == 1:
            return self
        return Workload(
            self.name, tuple(replace(r, arrival_s=r.arrival_s / rate_scale) for r in self.requests)
        )


def chain_hashes(block_ids: Iterable[int], full_blocks: int) -> tuple[int, ...]:
    """Chained hashes of the first ``full_blocks`` block ids (deterministic across processes)."""
    chained = []
    previous = 0
    for position, block_id in enumerate(block_ids):
        if position >= full_blocks:
            break
        previous = hash((previous, int(block_id)))
        chained.append(previous)
    return tuple(chained)


def make_request(
    request_id: str,
    arrival_s: float,
    input_tokens: int,
    output_tokens: int,
    block_ids: Sequence[int] | None,
    tenant: str = "default",
    slo_class: str | None = None,
    deadline_s: float | None = None,
    max_tokens: int | None = None,
    task_type: str = "chat",
    model: str | None = None,
    unique_key: int = 0,
) -> TraceRequest:
    """Validate and build one request.

    ``block_ids`` None means no prefix information: the blocks get ids unique to this request,
    derived from ``unique_key`` (ints only, so they are the same in every process).
    """
    if input_tokens < 1 or output_tokens < 1:
        raise ValueError(f"request {request_id}: input and output lengths must be >= 1")
    full_blocks = input_tokens // BLOCK_TOKENS
    if block_ids is None:
        block_ids = [hash((-1, unique_key, i)) for i in range(full_blocks)]
    return TraceRequest(
        request_id=request_id,
        arrival_s=arrival_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        block_hashes=chain_hashes(block_ids, full_blocks),
        tenant=tenant,
        slo_class=classify(input_tokens, slo_class),
        deadline_s=deadline_s,
        max_tokens=max_tokens,
        task_type=task_type,
        model=model,
    )


def load_workload(path: str | Path) -> Workload:
    """Load a Mooncake-style JSONL or an Azure CSV trace; ``ValueError`` names the bad line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"workload file not found: {path}")
    requests = _load_azure_csv(path) if path.suffix == ".csv" else _load_jsonl(path)
    if not requests:
        raise ValueError(f"{path}: no requests")
    return _rebased(path.name, requests)


def load_records(records: Iterable[dict[str, Any]], name: str) -> Workload:
    """A workload from Mooncake-format records already in memory (e.g. the synthetic mix)."""
    requests = [_from_record(row, f"r{i}") for i, row in enumerate(records)]
    if not requests:
        raise ValueError(f"{name}: no requests")
    return _rebased(name, requests)


def _from_record(row: dict[str, Any], default_id: str) -> TraceRequest:
    return make_request(
        request_id=str(row.get("request_id", default_id)),
        arrival_s=float(row["timestamp"]) / 1000.0,
        input_tokens=int(row["input_length"]),
        output_tokens=int(row["output_length"]),
        block_ids=row.get("hash_ids"),
        tenant=str(row.get("tenant", "default")),
        slo_class=row.get("slo_class"),
        deadline_s=_optional_float(row.get("deadline_s")),
        max_tokens=_optional_int(row.get("max_tokens")),
        task_type=str(row.get("task_type", "chat")),
        model=row.get("model"),
    )


def _rebased(name: str, requests: list[TraceRequest]) -> Workload:
    """Sorted by arrival, time starting at 0."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    start = ordered[0].arrival_s
    return Workload(name, tuple(replace(r, arrival_s=r.arrival_s - start) for r in ordered))


def _load_jsonl(path: Path) -> list[TraceRequest]:
    requests = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                requests.append(_from_record(json.loads(line), f"r{number - 1}"))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: invalid request ({exc!r})") from exc
    return requests


def _load_azure_csv(path: Path) -> list[TraceRequest]:
    requests = []
    with path.open(newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), 2):
            try:
                stamp = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
                requests.append(
                    make_request(
                        request_id=f"r{number - 2}",
                        arrival_s=stamp.timestamp(),
                        input_tokens=int(row["ContextTokens"]),
                        output_tokens=int(row["GeneratedTokens"]),
                        block_ids=None,
                        unique_key=number,
                        task_type="code" if "code" in path.name else "chat",
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: invalid row ({exc!r})") from exc
    return requests


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _optional_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
