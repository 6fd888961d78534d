"""One vLLM ``/metrics`` scrape, read into the numbers a TokenFleet ``Heartbeat`` carries.

Pure: text in, a frozen ``EngineMetrics`` out (no HTTP here; the adapter fetches the text).
Names as vLLM 0.32 (V1 engine, ``vllm/v1/metrics/loggers.py``) exposes them; every series carries
the labels ``model_name`` (the served model name) and ``engine`` (the data-parallel engine index):

=====================================  =========  ===========================================
series                                 type       meaning
=====================================  =========  ===========================================
``vllm:num_requests_running``          gauge      requests scheduled (prefilling or decoding)
``vllm:num_requests_waiting``          gauge      requests queued (incl. deferred ones)
``vllm:kv_cache_usage_perc``           gauge      KV-cache blocks in use, a fraction 0..1
``vllm:prefix_cache_queries_total``    counter    prompt tokens looked up in the prefix cache
``vllm:prefix_cache_hits_total``       counter    prompt tokens found there
``vllm:num_preemptions_total``         counter    requests preempted (optional here)
``vllm:cache_config_info``             info (1)   labels ``block_size``, ``num_gpu_blocks``
=====================================  =========  ===========================================

Despite its name, ``kv_cache_usage_perc`` is a fraction ("1 means 100 percent usage").
``cache_config_info`` has no ``model_name`` label (one per engine), so it is never filtered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from agents.policy.types import BLOCK_TOKENS
from schemas.events import MAX_COUNT, MAX_TOTAL

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_CONFIG = "vllm:cache_config_info"

REQUIRED = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS)
"""A scrape without any of these is not a vLLM V1 scrape we can use (``parse_metrics`` raises)."""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of one vLLM server, for one served model.

    Counts are summed over the scrape's engines (data-parallel ranks); ``kv_usage`` is their
    mean (every rank has the same cache). ``prefix_cache_*`` count prompt tokens and, like
    ``preemptions``, are cumulative since the server started. ``block_size`` (tokens per vLLM
    block) and ``num_gpu_blocks`` (summed over engines) are None when the scrape does not say.
    """

    running: int
    waiting: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    engines: int = 1


def parse_metrics(text: str, model_name: str | None = None) -> EngineMetrics:
    """Read one ``/metrics`` text; with ``model_name``, only the series of that served model.

    Raises ``ValueError`` (one line) when the text is not Prometheus exposition, when a required
    series (``REQUIRED``) is missing for the model, or when a value is negative or not finite.
    """
    values: dict[str, list[float]] = defaultdict(list)
    models_seen: set[str] = set()
    block_sizes: list[int] = []
    gpu_blocks: list[int] = []
    wanted = {*REQUIRED, PREEMPTIONS}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == CACHE_CONFIG:
                    _geometry(sample.labels, block_sizes, gpu_blocks)
                    continue
                if sample.name not in wanted:
                    continue
                seen = sample.labels.get("model_name")
                if seen is not None:
                    models_seen.add(seen)
                if model_name is not None and seen != model_name:
                    continue
                values[sample.name].append(float(sample.value))
    except Exception as exc:  # the parser raises ValueError, TypeError, IndexError on garbage
        raise ValueError(f"not a Prometheus exposition: {_one_line(exc)}") from None

    missing = [name for name in REQUIRED if not values.get(name)]
    if missing:
        scope = f" for model {model_name!r} (models seen: {sorted(models_seen)})" if model_name else ""
        raise ValueError(f"the scrape lacks {', '.join(missing)}{scope}")
    for name, series in values.items():
        if not all(math.isfinite(v) and v >= 0 for v in series):
            raise ValueError(f"{name} has a negative or non-finite value: {series}")

    usage = values[KV_USAGE]
    return EngineMetrics(
        running=_count(values[RUNNING]),
        waiting=_count(values[WAITING]),
        kv_usage=min(1.0, sum(usage) / len(usage)),
        prefix_cache_queries=_count(values[PREFIX_QUERIES]),
        prefix_cache_hits=_count(values[PREFIX_HITS]),
        preemptions=_count(values.get(PREEMPTIONS, [])),
        block_size=block_sizes[0] if block_sizes else None,
        num_gpu_blocks=sum(gpu_blocks) if gpu_blocks else None,
        engines=max(len(values[RUNNING]), 1),
    )


def heartbeat_fields(
    metrics: EngineMetrics, block_size: int | None, num_blocks: int | None, tokens_in_flight: int
) -> dict[str, int]:
    """The load fields of a ``schemas.events.Heartbeat`` (KV in blocks of ``BLOCK_TOKENS`` = 512).

    ``block_size`` / ``num_blocks``: the engine's vLLM block size and number of KV blocks; None
    takes the scrape's ``cache_config_info`` (``ValueError`` if it has neither).

    ====================  ==========================================================
    Heartbeat field       source
    ====================  ==========================================================
    waiting               ``vllm:num_requests_waiting``
    running               ``vllm:num_requests_running``
    tokens_in_flight      the dispatcher's count (argument; gateway-run requests added later)
    kv_blocks_total       ``max(1, num_blocks * block_size // 512)``
    kv_blocks_used        ``round(kv_usage * kv_blocks_total)``
    kv_block_tokens       ``block_size``
    prefix_cache_queries  ``vllm:prefix_cache_queries_total`` (tokens, cumulative)
    prefix_cache_hits     ``vllm:prefix_cache_hits_total`` (tokens, cumulative)
    preemptions           ``vllm:num_preemptions_total`` (cumulative)
    ====================  ==========================================================

    Values are capped at the Heartbeat's limits (``MAX_COUNT``, ``MAX_TOTAL``) so it validates.
    The rest (ids, ``endpoint_ready`` from ``/health``, version) is the caller's.
    """
    size = block_size if block_size is not None else metrics.block_size
    blocks = num_blocks if num_blocks is not None else metrics.num_gpu_blocks
    if size is None or blocks is None:
        raise ValueError("the KV-cache geometry is unknown: give block_size and num_blocks")
    if size < 1 or blocks < 0:
        raise ValueError(f"invalid KV-cache geometry: block_size={size}, num_blocks={blocks}")
    total = min(max(1, blocks * size // BLOCK_TOKENS), MAX_COUNT)
    return {
        "waiting": min(metrics.waiting, MAX_COUNT),
        "running": min(metrics.running, MAX_COUNT),
        "tokens_in_flight": min(max(tokens_in_flight, 0), MAX_COUNT),
        "kv_blocks_total": total,
        "kv_blocks_used": min(round(metrics.kv_usage * total), total),
        "kv_block_tokens": min(size, MAX_COUNT),
        "prefix_cache_queries": min(metrics.prefix_cache_queries, MAX_TOTAL),
        "prefix_cache_hits": min(metrics.prefix_cache_hits, MAX_TOTAL),
        "preemptions": min(metrics.preemptions, MAX_TOTAL),
    }


def _geometry(labels: dict[str, str], block_sizes: list[int], gpu_blocks: list[int]) -> None:
    # vLLM writes every CacheConfig attribute as a string label; unset ones read "None".
    size, blocks = labels.get("block_size", ""), labels.get("num_gpu_blocks", "")
    if size.isdigit() and int(size) > 0:
        block_sizes.append(int(size))
    if blocks.isdigit():
        gpu_blocks.append(int(blocks))


def _count(series: list[float]) -> int:
    # Prometheus exposes counts as floats ("12100.0"); exact below 2**53 (MAX_TOTAL).
    return round(sum(series))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
