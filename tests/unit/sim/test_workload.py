"""Trace loaders, the synthetic mix and the SLO classification rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.workloads.sources import open_workload
from sim.workloads.synthetic import SyntheticMix
from sim.workloads.trace import chain_hashes, load_workload

TRACES = Path(__file__).resolve().parents[3] / "sim" / "traces"


def test_mooncake_trace_loads_with_chained_full_block_hashes() -> None:
    w = load_workload(TRACES / "mooncake" / "conversation_trace.jsonl")
    assert len(w.requests) == 12_031
    first = w.requests[0]
    assert first.input_tokens == 6758 and first.output_tokens == 500
    assert len(first.block_hashes) == 6758 // 512  # the partial last block is not shared
    assert w.requests[1].block_hashes[0] == first.block_hashes[0]  # same system prompt block
    assert sum(r.slo_class == "long_context" for r in w.requests) == 828  # input > 32k


def test_azure_trace_loads_without_prefix_sharing() -> None:
    w = load_workload(TRACES / "azure" / "AzureLLMInferenceTrace_code.csv")
    assert len(w.requests) == 8819 and w.requests[0].arrival_s == 0.0
    blocks = [b for r in w.requests for b in r.block_hashes]
    assert len(blocks) == len(set(blocks))


def test_chained_hashes_make_equal_ids_after_a_difference_unequal() -> None:
    a, b = chain_hashes([1, 2, 3], 3), chain_hashes([1, 9, 3], 3)
    assert a[0] == b[0] and a[2] != b[2]


def test_bad_trace_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_workload(bad)


def test_rate_scale_compresses_time() -> None:
    w = load_workload(TRACES / "mooncake" / "conversation_trace.jsonl")
    assert w.scaled(2.0).requests[-1].arrival_s == pytest.approx(w.requests[-1].arrival_s / 2)


def test_synthetic_mix_is_seeded_and_has_every_kind() -> None:
    a = SyntheticMix(duration_s=900, seed=5).generate()
    assert a == SyntheticMix(duration_s=900, seed=5).generate()
    assert a != SyntheticMix(duration_s=900, seed=6).generate()
    kinds = {r["task_type"] for r in a}
    assert kinds == {"chat", "doc_qa", "api", "batch"}
    w = open_workload("synthetic:duration_s=900", seed=5)
    classes = {r.slo_class for r in w.requests}
    assert classes == {"interactive", "long_context", "batch"}
    # Chat history grows turn by turn: some prompts share long prefixes with earlier ones.
    seen: set[int] = set()
    reused = 0
    for r in w.requests:
        reused += sum(1 for b in r.block_hashes if b in seen)
        seen.update(r.block_hashes)
    assert reused > 0.2 * sum(len(r.block_hashes) for r in w.requests)


def test_unknown_synthetic_option_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown synthetic option"):
        open_workload("synthetic:speed=3")
