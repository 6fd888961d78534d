"""The emulated instance's ``/metrics``: vLLM's series, as ``dispatcher/engines/vllm/metrics.py``
reads them, from the engine model's report (``schemas.events.Heartbeat``).

Every series carries ``model_name`` (the served model name) and ``engine="0"``, except
``vllm:cache_config_info`` (``engine`` only, as vLLM): its ``block_size`` is 512 (one engine-model
block, see ``kv_events.py``) and ``num_gpu_blocks`` the cache's blocks, so a scraper's
``kv_blocks_total`` is the instance's and ``kv_blocks_used = kv_cache_usage_perc x total`` its
blocks in use exactly.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.policy.types import BLOCK_TOKENS
from dispatcher.engines.vllm import metrics as vllm
from schemas.events import Heartbeat

_GAUGES = {
    vllm.RUNNING: "Number of requests in model execution batches.",
    vllm.WAITING: "Number of requests waiting to be processed.",
    vllm.KV_USAGE: "KV-cache usage. 1 means 100 percent usage.",
}
_COUNTERS = {
    vllm.PREFIX_QUERIES: "Prefix cache queries, in terms of number of queried tokens.",
    vllm.PREFIX_HITS: "Prefix cache hits, in terms of number of cached tokens.",
    vllm.PREEMPTIONS: "Cumulative number of preemption from the engine.",
}
_LABELS = ["model_name", "engine"]


def render(beat: Heartbeat, model_name: str) -> bytes:
    """The Prometheus text of one scrape of an instance that reports ``beat``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(beat, model_name))
    return generate_latest(registry)


class _Scrape(Collector):
    def __init__(self, beat: Heartbeat, model_name: str) -> None:
        self.beat = beat
        self.labels = [model_name, "0"]

    def collect(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        beat = self.beat
        gauges = {
            vllm.RUNNING: beat.running,
            vllm.WAITING: beat.waiting,
            vllm.KV_USAGE: beat.kv_blocks_used / beat.kv_blocks_total,
        }
        counters = {
            vllm.PREFIX_QUERIES: beat.prefix_cache_queries,
            vllm.PREFIX_HITS: beat.prefix_cache_hits,
            vllm.PREEMPTIONS: beat.preemptions,
        }
        families: list[GaugeMetricFamily | CounterMetricFamily] = []
        for name, value in gauges.items():
            gauge = GaugeMetricFamily(name, _GAUGES[name], labels=_LABELS)
            gauge.add_metric(self.labels, value)
            families.append(gauge)
        for name, count in counters.items():
            # The client adds the ``_total`` of a counter's sample itself.
            counter = CounterMetricFamily(name.removesuffix("_total"), _COUNTERS[name], labels=_LABELS)
            counter.add_metric(self.labels, count)
            families.append(counter)
        config = GaugeMetricFamily(
            vllm.CACHE_CONFIG,
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"],
        )
        config.add_metric([str(BLOCK_TOKENS), str(beat.kv_blocks_total), "True", "0"], 1.0)
        families.append(config)
        return families
