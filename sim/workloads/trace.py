"""Workloads: the requests of a trace, as the simulator knows them (true output length included).

Loaders:
- Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (512-token block ids, equal prefixes have equal ids); optional ``tenant``, ``slo_class``,
  ``deadline_s`` (seconds after arrival), ``max_tokens``, ``task_type``, ``model``, and for
  fleets of several data centres ``home_dc``, ``model_version``, ``allowed_regions`` (a list);
  for closed-loop users ``session_id`` and ``think_s`` (``sim/loop/sessions.py``); and
  ``prefix_tail`` ``[blocks, tokens]``: once an engine holds the first ``blocks`` blocks of its
  chain, it also holds the ``tokens`` after them (``TraceRequest.reusable_tokens``).
- Azure LLM inference CSV: ``TIMESTAMP, ContextTokens, GeneratedTokens``; no prefix
  information, so every block is unique to its request.

Every field is checked when a trace is loaded, and a bad one is a ``ValueError`` naming the
file, the line and the field: a line must be a JSON object; ``timestamp`` a finite number of
ms in [0, 10^10] (an Azure ``TIMESTAMP`` within 10^7 s of the first row's); lengths integers in
[1, 10^7]; ``deadline_s`` finite and > 0; ``think_s`` finite and >= 0; ``max_tokens`` an integer in
[1, 10^7]; ``hash_ids``
a list of integers; ``prefix_tail`` two integers, ``blocks`` in [1, len(hash_ids)] and
``blocks * 512 + tokens`` at most ``input_length``; the text fields strings.

Block hashes are chained (hash of the previous chained hash and the block id), so equal hash at
position i means the whole prefix up to block i is equal. Only full blocks are hashed: a partial
last block is never shared, as in vLLM.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy.common.slo import classify
from agents.policy.types import BLOCK_TOKENS
from schemas.events import MAX_TOKENS  # largest input or output length (and ``max_tokens``)

DEFAULT_OUTPUT_BUDGET = 2048
MAX_TIMESTAMP_MS = 10**10
"""Largest ``timestamp`` (ms) of a trace line, and largest arrival span: about 115 days."""


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
    home_dc: str = ""
    model_version: str = ""
    allowed_regions: tuple[str, ...] = ()
    session_id: str = ""  # the user or session whose calls follow one another ("": none)
    think_s: float | None = None  # sent this long after its session's previous call ended
    prefix_tail: tuple[int, int] | None = None  # (blocks, tokens): see ``reusable_tokens``

    def reusable_tokens(self, matched: int) -> int:
        """Tokens of its prompt an engine holding the first ``matched`` blocks of its chain need
        not compute: ``matched * 512``, or, once ``matched`` reaches ``prefix_tail``'s blocks,
        ``blocks * 512 + tokens`` if more. The tail is what an engine reusing prefixes in blocks
        finer than 512 tokens (vLLM's 16 or 32) also finds past the blocks the chain can match:
        the part of the first unshared block that an earlier prompt with the same prefix had
        too, and what the engine kept of an earlier call's answer that this prompt repeats (it
        may span several blocks). At most ``input_tokens`` (the engine computes the last one
        anyway, for the logits: the caller caps)."""
        if self.prefix_tail is not None and matched >= self.prefix_tail[0]:
            blocks, tokens = self.prefix_tail
            return max(matched * BLOCK_TOKENS, blocks * BLOCK_TOKENS + tokens)
        return matched * BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: tuple[TraceRequest, ...]

    def scaled(self, rate_scale: float) -> Workload:
        """The same requests arriving ``rate_scale`` times as fast, think times as much shorter
        (deadlines unchanged)."""
        if rate_scale <= 0:
            raise ValueError("--rate-scale must be > 0")
        if rate_scale == 1:
            return self
        return Workload(self.name, tuple(_faster(r, rate_scale) for r in self.requests))

    def jittered(self, bin_s: float, seed: int) -> Workload:
        """Arrivals spread uniformly inside their time bin: each moves to ``arrival + U[0, bin_s)``
        (seeded), then all are sorted again. For traces whose timestamps were rounded into bins
        (Mooncake's, into 3 s bins: many requests share an instant), so a burst the recording made does not
        reach the router as one. ``bin_s`` 0 returns the workload unchanged."""
        if not bin_s >= 0 or math.isinf(bin_s):
            raise ValueError("--jitter-arrivals must be a finite number of seconds >= 0")
        if bin_s == 0:
            return self
        rng = np.random.default_rng([seed, 0x6A17])
        offsets = rng.uniform(0.0, bin_s, len(self.requests))
        pairs = zip(self.requests, offsets, strict=True)
        moved = [replace(r, arrival_s=r.arrival_s + float(d)) for r, d in pairs]
        moved.sort(key=lambda r: r.arrival_s)
        return Workload(f"{self.name}+jitter{bin_s:g}s", tuple(moved))


def _faster(request: TraceRequest, rate_scale: float) -> TraceRequest:
    think = None if request.think_s is None else request.think_s / rate_scale
    return replace(request, arrival_s=request.arrival_s / rate_scale, think_s=think)


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
    home_dc: str = "",
    model_version: str = "",
    allowed_regions: tuple[str, ...] = (),
    session_id: str = "",
    think_s: float | None = None,
    prefix_tail: tuple[int, int] | None = None,
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
    chain = chain_hashes(block_ids, full_blocks)
    if prefix_tail is not None:
        blocks, tokens = prefix_tail
        if not 1 <= blocks <= len(chain) or tokens < 0 or blocks * BLOCK_TOKENS + tokens > input_tokens:
            raise ValueError(
                f"field 'prefix_tail' must be [blocks, tokens] with blocks in [1, {len(chain)}] "
                f"and blocks * {BLOCK_TOKENS} + tokens <= input_length, got {list(prefix_tail)}"
            )
    return TraceRequest(
        request_id=request_id,
        arrival_s=arrival_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        block_hashes=chain,
        tenant=tenant,
        slo_class=classify(input_tokens, slo_class),
        deadline_s=deadline_s,
        max_tokens=max_tokens,
        task_type=task_type,
        model=model,
        home_dc=home_dc,
        model_version=model_version,
        allowed_regions=allowed_regions,
        session_id=session_id,
        think_s=think_s,
        prefix_tail=prefix_tail,
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
    requests = []
    for i, row in enumerate(records):
        try:
            requests.append(_from_record(row, f"r{i}", i))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}: record {i}: {exc}") from None
    if not requests:
        raise ValueError(f"{name}: no requests")
    return _rebased(name, requests)


RECORD_FIELDS = (
    "timestamp", "input_length", "output_length", "hash_ids", "request_id", "tenant", "slo_class",
    "deadline_s", "max_tokens", "task_type", "model", "home_dc", "model_version", "allowed_regions",
    "session_id", "think_s", "prefix_tail",
)  # fmt: skip
"""The fields a Mooncake-format record may carry; any other is an error (a typo would otherwise
be silently ignored)."""


def _from_record(row: object, default_id: str, position: int) -> TraceRequest:
    """One request from a Mooncake record; ``ValueError`` naming the first bad field. A record
    without ``hash_ids`` shares no block: its ids derive from its ``position`` in the trace."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    unknown = sorted(str(key) for key in row if key not in RECORD_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {unknown} (known: {', '.join(RECORD_FIELDS)})")
    for required in ("timestamp", "input_length", "output_length"):
        if required not in row:
            raise ValueError(f"field {required!r} is missing")
    timestamp = _finite(row["timestamp"], "timestamp")
    if not 0 <= timestamp <= MAX_TIMESTAMP_MS:
        raise ValueError(f"field 'timestamp' must be in [0, {MAX_TIMESTAMP_MS:.0e}] ms, got {timestamp!r}")
    deadline = row.get("deadline_s")
    if deadline is not None:
        deadline = _finite(deadline, "deadline_s")
        if deadline <= 0:
            raise ValueError(f"field 'deadline_s' must be > 0 seconds, got {deadline!r}")
    max_tokens = row.get("max_tokens")
    if max_tokens is not None:
        max_tokens = _integer(max_tokens, "max_tokens")
    think = row.get("think_s")
    if think is not None:
        think = _finite(think, "think_s")
        if think < 0:
            raise ValueError(f"field 'think_s' must be >= 0 seconds, got {think!r}")
    return make_request(
        request_id=_text(row.get("request_id", default_id), "request_id", allow_int=True),
        arrival_s=timestamp / 1000.0,
        input_tokens=_integer(row["input_length"], "input_length"),
        output_tokens=_integer(row["output_length"], "output_length"),
        block_ids=_block_ids(row.get("hash_ids")),
        unique_key=position,
        tenant=_text(row.get("tenant", "default"), "tenant", allow_int=True),
        slo_class=_optional_text(row.get("slo_class"), "slo_class"),
        deadline_s=deadline,
        max_tokens=max_tokens,
        task_type=_text(row.get("task_type", "chat"), "task_type"),
        model=_optional_text(row.get("model"), "model"),
        home_dc=_text(row.get("home_dc", ""), "home_dc"),
        model_version=_text(row.get("model_version", ""), "model_version"),
        allowed_regions=_texts(row.get("allowed_regions", []), "allowed_regions"),
        session_id=_text(row.get("session_id", ""), "session_id", allow_int=True),
        think_s=think,
        prefix_tail=_non_negative_pair(row.get("prefix_tail"), "prefix_tail"),
    )


def _non_negative_pair(value: object, field: str) -> tuple[int, int] | None:
    """A list of two non-negative integers (None when absent)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"field {field!r} must be a list of two integers, got {_shown(value)}")
    first, second = (_integer(v, field, low=0) for v in value)
    return first, second


def _texts(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"field {field!r} must be a list of strings, got {_shown(value)}")
    return tuple(_text(v, field) for v in value)


def _finite(value: object, field: str) -> float:
    """``value`` as a finite float (a number or a numeric string), else ValueError naming ``field``."""
    number: float | None = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = None
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise ValueError(f"field {field!r} must be a finite number, got {_shown(value)}")
    return number


def _integer(value: object, field: str, low: int = 1, high: int = MAX_TOKENS) -> int:
    """``value`` as an integer in [low, high] (an int, an integral float or a digit string)."""
    number: float | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, numbers.Integral):
        number = float(int(value)) if abs(int(value)) <= 10**18 else None
    elif isinstance(value, numbers.Real):
        number = float(value)
    elif isinstance(value, str) and _DIGITS.match(value):
        number = float(int(value))
    if number is None or not math.isfinite(number) or not number.is_integer() or not low <= number <= high:
        raise ValueError(f"field {field!r} must be an integer in [{low}, {high}], got {_shown(value)}")
    return int(number)


_DIGITS = re.compile(r"^\s*[+-]?\d{1,18}\s*$")


def _shown(value: object) -> str:
    """``repr(value)``, cut short: a bad field must not flood the one-line error."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _text(value: object, field: str, allow_int: bool = False) -> str:
    """A string field (an integer too for ids and tenants, which traces often number)."""
    if isinstance(value, str) or (allow_int and isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"field {field!r} must be a string, got {_shown(value)}")


def _optional_text(value: object, field: str) -> str | None:
    return None if value is None else _text(value, field)


def _block_ids(value: object) -> list[int] | None:
    if value is None:
        return None
    if type(value) is list and all(type(v) is int for v in value):
        return list(value)  # the common case, checked fast (JSON integers are ``int``)
    if not isinstance(value, list) or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value
    ):
        raise ValueError("field 'hash_ids' must be a list of integers")
    return [int(v) for v in value]


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
                row = json.loads(line)
            except ValueError as exc:  # JSONDecodeError, or a number too long to convert
                message = getattr(exc, "msg", str(exc))
                raise ValueError(f"{path}:{number}: not valid JSON ({message})") from None
            try:
                requests.append(_from_record(row, f"r{number - 1}", number))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    return requests


_AZURE_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _load_azure_csv(path: Path) -> list[TraceRequest]:
    requests = []
    first: float | None = None
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [f for f in _AZURE_FIELDS if f not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for number, row in enumerate(reader, 2):
            try:
                arrival_s = _azure_timestamp(row["TIMESTAMP"])
                first = arrival_s if first is None else first
                if abs(arrival_s - first) > MAX_TIMESTAMP_MS / 1000:
                    raise ValueError(
                        f"field 'TIMESTAMP' is more than {MAX_TIMESTAMP_MS / 1000:.0e} s from the first row's"
                    )
                requests.append(
                    make_request(
                        request_id=f"r{number - 2}",
                        arrival_s=arrival_s,
                        input_tokens=_integer(row["ContextTokens"], "ContextTokens"),
                        output_tokens=_integer(row["GeneratedTokens"], "GeneratedTokens"),
                        block_ids=None,
                        unique_key=number,
                        task_type="code" if "code" in path.name else "chat",
                    )
                )
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    return requests


def _azure_timestamp(value: str | None) -> float:
    try:
        stamp = datetime.fromisoformat((value or "").strip()[:26])
    except ValueError:
        raise ValueError(f"field 'TIMESTAMP' must be an ISO date and time, got {_shown(value)}") from None
    try:
        return stamp.timestamp()
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"field 'TIMESTAMP' is out of range, got {_shown(value)}") from None
