"""Trace loaders, the synthetic mix and the SLO classification rule."""

from __future__ import annotations

import json
import re
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


def test_records_without_hash_ids_share_no_block(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    line = json.dumps({"timestamp": 0, "input_length": 2048, "output_length": 8})
    trace.write_text(f"{line}\n{line}\n")
    first, second = load_workload(trace).requests
    assert len(first.block_hashes) == 4
    assert set(first.block_hashes).isdisjoint(second.block_hashes)


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


GOOD_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1}'


TAILED = '{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": '


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("[1, 2, 3]", "expected a JSON object, got list"),
        ('"text"', "expected a JSON object, got str"),
        ('{"timestamp": NaN, "input_length": 10, "output_length": 1}', "'timestamp'"),
        ('{"timestamp": Infinity, "input_length": 10, "output_length": 1}', "'timestamp'"),
        ('{"timestamp": 1e300, "input_length": 10, "output_length": 1}', "'timestamp' must be in [0, 1e+10]"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1}', "'timestamp' must be in"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "deadline_s": -1}', "'deadline_s'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "deadline_s": NaN}', "'deadline_s'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "deadline_s": 0}', "'deadline_s'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "max_tokens": 0}', "'max_tokens'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "max_tokens": -3}', "'max_tokens'"),
        ('{"timestamp": 0, "input_length": -10, "output_length": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": NaN, "output_length": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": -1}', "'output_length'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": NaN}', "'output_length'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 2.5}', "'output_length'"),
        ('{"timestamp": 0, "input_length": 10000001, "output_length": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": true, "output_length": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "ab"}', "'hash_ids'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "model": 3}', "'model'"),
        ('{"input_length": 10, "output_length": 1}', "'timestamp' is missing"),
        (TAILED + '[1, 2], "prefix_tail": 3}', "'prefix_tail' must be a list of two integers"),
        (
            TAILED + '[1, 2], "prefix_tail": [3, 1]}',
            "'prefix_tail' must be [blocks, tokens] with blocks in [1, 2]",
        ),
        (TAILED + '[1, 2], "prefix_tail": [0, 1]}', "'prefix_tail' must be [blocks, tokens]"),
        (TAILED + '[1, 2], "prefix_tail": [2, 77]}', "'prefix_tail' must be [blocks, tokens]"),
        (TAILED + '[1], "prefix_tail": [1, -1]}', "'prefix_tail' must be an integer in [0,"),
        ("{oops", "not valid JSON"),
    ],
)
def test_every_field_of_a_trace_line_is_checked(tmp_path: Path, line: str, field: str) -> None:
    """The error names the file, the line and the field; nothing bad gets through."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{GOOD_LINE}\n\n{line}\n")
    with pytest.raises(ValueError) as raised:
        load_workload(bad)
    message = str(raised.value)
    assert message.startswith(f"{bad}:3: ") and field in message, message
    assert len(message) < 200 and "\n" not in message


def test_numbers_in_range_still_load(tmp_path: Path) -> None:
    trace = tmp_path / "ok.jsonl"
    lines = [
        '{"timestamp": 1e10, "input_length": 10000000, "output_length": 1, "deadline_s": 0.5}',
        '{"timestamp": "5", "input_length": "12", "output_length": 3.0, "max_tokens": 1}',
    ]
    trace.write_text("\n".join(lines) + "\n")
    w = load_workload(trace)
    assert [r.input_tokens for r in w.requests] == [12, 10_000_000]
    assert w.requests[-1].arrival_s == pytest.approx(1e7 - 0.005)
    assert w.requests[0].output_tokens == 3 and w.requests[0].max_tokens == 1


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("2023-11-16 18:15:50.0,-3,44", "'ContextTokens' must be an integer"),
        ("2023-11-16 18:15:50.0,3,nan", "'GeneratedTokens' must be an integer"),
        ("2023-11-16 18:15:50.0,3,0", "'GeneratedTokens' must be an integer"),
        ("yesterday,3,4", "'TIMESTAMP' must be an ISO date"),
        ("2123-11-16 18:15:50.0,3,4", "'TIMESTAMP' is more than 1e+07 s from the first row's"),
    ],
)
def test_every_field_of_an_azure_row_is_checked(tmp_path: Path, row: str, expected: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n{row}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}:3: .*{re.escape(expected)}"):
        load_workload(bad)


@pytest.mark.parametrize(
    "spec",
    [
        "synthetic:duration_s=inf",
        "synthetic:rate_per_s=nan",
        "synthetic:duration_s=-1",
        "synthetic:rate_per_s=0",
    ],
)
def test_synthetic_options_out_of_range_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match=r"synthetic (duration_s|rate_per_s) must be a finite number"):
        open_workload(spec)


def test_a_fleet_is_bounded() -> None:
    from sim.engine.fleet import MAX_INSTANCES, parse_fleet

    assert len(parse_fleet(f"{MAX_INSTANCES}xllama3-8b-h100").instances) == MAX_INSTANCES
    for spec in ("100000000xllama3-8b-h100", f"{MAX_INSTANCES}xllama3-8b-h100+1xllama3-8b-h100"):
        with pytest.raises(ValueError, match=f"at most {MAX_INSTANCES} instances"):
            parse_fleet(spec)
    with pytest.raises(ValueError, match="count must be >= 1"):
        parse_fleet("0xllama3-8b-h100")


def test_a_fleet_file_is_bounded_and_checked(tmp_path: Path) -> None:
    from sim.engine.fleet import parse_fleet

    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        "data_centres:\n  - name: a\n    instances:\n      - {count: 100000000, profile: llama3-8b-h100}\n"
    )
    with pytest.raises(ValueError, match="at most 100000 instances"):
        parse_fleet(str(spec))
    spec.write_text(
        "data_centres:\n  - name: a\n    instances:\n      - {count: -2, profile: llama3-8b-h100}\n"
    )
    with pytest.raises(ValueError, match="count must be >= 1"):
        parse_fleet(str(spec))
    spec.write_text("data_centres:\n  - just-a-name\n")
    with pytest.raises(ValueError, match="not a fleet file"):
        parse_fleet(str(spec))


def test_arrivals_at_one_instant_are_measured_until_the_last_completion(tmp_path: Path) -> None:
    """The arrival span is 0 s: the window runs to the last end of an attempt (at least 1 s)."""
    from agents.policy.common.slo import DEFAULT_SLO_CLASSES
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.metrics import measurement_window, report
    from sim.loop.config import SimConfig
    from sim.loop.runner import simulate

    trace = tmp_path / "instant.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": 5000, "input_length": {n}, "output_length": 40}}\n' for n in (600, 900, 1200)
        )
    )
    workload = load_workload(trace)
    run = simulate(workload, parse_fleet("1xllama3-8b-h100"), "least-tokens", SimConfig())
    assert run.window == (0.0, 0.0)
    start, end = measurement_window(run.attempts, run.window)
    assert start == 0.0 and end == max(max(a.end_s or 0.0 for a in run.attempts), 1.0)
    metrics = report(run.attempts, run.window, DEFAULT_SLO_CLASSES, run.busy_s)
    assert metrics["completed"] == 3
    assert metrics["goodput_tokens_per_s"] == metrics["output_tokens_per_s"] == round(120 / end, 6)
    assert metrics["compliant_share"] == 1.0 and metrics["busy_fraction"] is None


def test_a_record_with_an_unknown_field_or_slo_class_is_one_clear_error(tmp_path: Path) -> None:
    from sim.engine.fleet import parse_fleet
    from sim.loop.config import SimConfig
    from sim.loop.runner import simulate

    typo = tmp_path / "typo.jsonl"
    typo.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "slo_clas": "batch"}\n')
    with pytest.raises(ValueError, match=r"unknown fields \['slo_clas'\]"):
        load_workload(typo)
    platinum = tmp_path / "platinum.jsonl"
    platinum.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "slo_class": "platinum"}\n')
    with pytest.raises(ValueError, match="SLO class 'platinum' is not configured"):
        simulate(load_workload(platinum), parse_fleet("1xllama3-8b-h100"), "round-robin", SimConfig())


def test_a_synthetic_mix_may_name_several_models_and_versions() -> None:
    """Tenant k asks for models[k mod n]; without ``models`` the records are unchanged."""
    plain = SyntheticMix(duration_s=120, seed=3).generate()
    both = SyntheticMix(duration_s=120, seed=3, models=("llama3-8b@2", "qwen3-14b")).generate()
    assert [{k: v for k, v in r.items() if k not in ("model", "model_version")} for r in both] == plain
    for record in both:
        tenant = int(record["tenant"].removeprefix("tenant-"))
        expected = {"model": "llama3-8b", "model_version": "2"} if tenant % 2 == 0 else {"model": "qwen3-14b"}
        assert {k: record[k] for k in ("model", "model_version") if k in record} == expected
    w = open_workload("synthetic:duration_s=120,models=llama3-8b@2+qwen3-14b", seed=3)
    assert {(r.model, r.model_version) for r in w.requests} == {("llama3-8b", "2"), ("qwen3-14b", "")}
    for bad in (("",), ("llama3-8b@",), ("@2",)):
        with pytest.raises(ValueError, match="synthetic models must be"):
            SyntheticMix(models=bad)
