"""Reading a real vLLM 0.32 ``/metrics`` scrape (``tests/fixtures/vllm/``) into Heartbeat fields.

``metrics.txt`` was scraped while five 900-token prompts generated 2 500 tokens each on a
256 x 32-token cache (one request preempted back to waiting); ``metrics_idle.txt`` after they
finished. See ``tests/fixtures/vllm/README.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.engines.vllm.metrics import EngineMetrics, heartbeat_fields, parse_metrics
from schemas.events import Heartbeat

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
SCRAPE = (FIXTURES / "metrics.txt").read_text()
IDLE = (FIXTURES / "metrics_idle.txt").read_text()


def test_the_real_scrape_under_load() -> None:
    metrics = parse_metrics(SCRAPE)
    assert metrics == EngineMetrics(
        running=4,
        waiting=1,
        kv_usage=0.8313725490196078,  # 212 of the 255 usable blocks (vLLM keeps one null block)
        prefix_cache_queries=9300,
        prefix_cache_hits=672,
        preemptions=0,
        block_size=32,
        num_gpu_blocks=256,
        engines=1,
    )
    assert parse_metrics(SCRAPE, model_name="tiny-llama") == metrics


def test_the_real_scrape_after_preemptions() -> None:
    metrics = parse_metrics(IDLE, "tiny-llama")
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (0, 0, 0.0)
    assert metrics.preemptions == 4
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (9300, 672)


def test_another_model_name_finds_nothing() -> None:
    with pytest.raises(ValueError, match=r"for model 'other' \(models seen: \['tiny-llama'\]\)"):
        parse_metrics(SCRAPE, "other")


@pytest.mark.parametrize(
    "dropped", ["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:prefix_cache_hits_total"]
)
def test_a_scrape_missing_a_required_metric_is_refused(dropped: str) -> None:
    text = "\n".join(line for line in SCRAPE.splitlines() if not line.startswith(dropped + "{"))
    with pytest.raises(ValueError, match=f"lacks {dropped}") as caught:
        parse_metrics(text)
    assert "\n" not in str(caught.value)


def test_not_a_scrape_is_refused() -> None:
    with pytest.raises(ValueError, match="the scrape lacks"):
        parse_metrics("")
    with pytest.raises(ValueError, match="not a Prometheus exposition"):
        parse_metrics("vllm:num_requests_running{model_name= 3 4 5\n")
    with pytest.raises(ValueError, match="not a Prometheus exposition"):
        parse_metrics("<html>502 Bad Gateway</html>\n")


def test_a_negative_gauge_is_refused() -> None:
    text = SCRAPE.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} -1.0',
    )
    with pytest.raises(ValueError, match="vllm:num_requests_waiting has a negative"):
        parse_metrics(text)


def test_data_parallel_engines_add_up_and_average_the_kv_usage() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25',
            "# TYPE vllm:prefix_cache_queries counter",
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0',
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0',
            "# TYPE vllm:prefix_cache_hits counter",
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0',
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5.0',
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0',
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0',
            "",
        ]
    )
    metrics = parse_metrics(text, "m")
    assert (metrics.running, metrics.waiting, metrics.kv_usage, metrics.engines) == (5, 1, 0.375, 2)
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits, metrics.preemptions) == (150, 15, 0)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 2000)


def test_heartbeat_fields_count_kv_in_512_token_blocks() -> None:
    metrics = parse_metrics(SCRAPE)
    fields = heartbeat_fields(metrics, None, None, tokens_in_flight=5_000)
    # 256 blocks x 32 tokens = 8192 tokens = 16 router blocks; 0.8314 x 16 = 13.3
    assert fields == {
        "waiting": 1,
        "running": 4,
        "tokens_in_flight": 5_000,
        "kv_blocks_total": 16,
        "kv_blocks_used": 13,
        "kv_block_tokens": 32,
        "prefix_cache_queries": 9300,
        "prefix_cache_hits": 672,
        "preemptions": 0,
    }
    ids = {"instance_id": "vllm-0", "dc": "local", "model": "tiny-llama", "model_version": "v1"}
    beat = Heartbeat.model_validate({**ids, **fields})
    assert beat.kv_blocks_used == 13
    assert heartbeat_fields(metrics, 16, 10, 0)["kv_blocks_total"] == 1  # less than one 512 block
    assert heartbeat_fields(metrics, 32, 2048, 0)["kv_blocks_total"] == 128


def test_heartbeat_fields_need_the_cache_geometry() -> None:
    text = "\n".join(line for line in SCRAPE.splitlines() if not line.startswith("vllm:cache_config_info"))
    metrics = parse_metrics(text)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (None, None)
    with pytest.raises(ValueError, match="geometry is unknown"):
        heartbeat_fields(metrics, None, None, 0)
    assert heartbeat_fields(metrics, 32, 256, 0)["kv_blocks_total"] == 16
