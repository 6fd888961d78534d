"""``tokenfleet replay export`` against the real embedded ClickHouse engine (chdb): a run written
through the sink comes back as a workload the simulator loads and a fleet it accepts; a prompt's
block hashes reach the store by both paths a request takes (a gateway's direct call, a text prompt
on ``tf.requests``), and its text by neither."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from clickhouse_connect.driver.client import Client
from tokenizers import Tokenizer, models, pre_tokenizers

from agents.handlers import SchedulerAgents
from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.routing import RoutingService
from cli.main import main
from infra.clickhouse import FeedbackSink, connect, migrate
from infra.clickhouse.replay_export import ExportError, export_run
from infra.prompts import Prompts, PromptTokenizer
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import (
    AdmissionDecision,
    ChatMessage,
    Completion,
    Heartbeat,
    InferenceRequest,
    RoutingDecision,
)
from sim.engine.fleet import fleet_from_doc
from sim.workloads.trace import chain_hashes, load_records, load_workload
from tests.functional.fakes import MemoryPublisher, MemoryState, RecordingTelemetry

RUN = "run-a"
T0 = float(int(time.time()) - 600)  # recent: the store keeps heartbeats 7 days
MODEL = "llama3-8b"


def request(rid: str, at: float, **fields: Any) -> InferenceRequest:
    values: dict[str, Any] = {"model": MODEL, "input_tokens": 1600, "output_budget": 200, "ts": T0 + at}
    values.update(fields)
    return InferenceRequest(request_id=rid, **values)


def admitted(r: InferenceRequest, action: str = "admit", slo_class: str = "interactive") -> AdmissionDecision:
    return AdmissionDecision(
        request_id=r.request_id, attempt=r.attempt, model=r.model, slo_class=slo_class, action=action,  # type: ignore[arg-type]
        policy="round-robin", ts=r.ts + 0.001,
    )  # fmt: skip


def routed(r: InferenceRequest, instance: str = "i-a", slo_class: str = "interactive") -> RoutingDecision:
    return RoutingDecision(
        request_id=r.request_id, attempt=r.attempt, model=r.model, slo_class=slo_class, dc="A",
        instance_id=instance, policy="round-robin", decision_latency_s=0.001, request=r, ts=r.ts + 0.001,
    )  # fmt: skip


def ended(r: InferenceRequest, status: str, output_tokens: int, cached_tokens: int = 0) -> Completion:
    return Completion(
        request_id=r.request_id, attempt=r.attempt, instance_id="i-a", model=r.model, status=status,  # type: ignore[arg-type]
        arrival_ts=r.ts, ttft_s=0.2, tpot_s=0.02, e2e_s=2.0, input_tokens=r.input_tokens,
        output_tokens=output_tokens, cached_tokens=cached_tokens, ts=r.ts + 2.0,
    )  # fmt: skip


def beat(instance: str, dc: str, profile: str, at: float, **fields: Any) -> Heartbeat:
    values: dict[str, Any] = {
        "instance_id": instance, "dc": dc, "model": MODEL, "model_version": "2", "profile": profile,
        "waiting": 0, "running": 0, "tokens_in_flight": 0, "kv_blocks_used": 0, "kv_blocks_total": 100,
        "ts": T0 + at,
    }  # fmt: skip
    values.update(fields)
    return Heartbeat(**values)


def write_run(client: Client) -> None:
    """Run ``RUN``: r1 hashed, r2 retried, r3 an old row without hashes, r4 rejected, r5 aborted;
    two instances in two DCs; one request of another run."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id=RUN, run_policy="round-robin")
    r1 = request("r1", 0.0, prompt_block_hashes=(11, 12, 13), tenant="t1", home_dc="A", model_version="2",
                 allowed_regions=("eu",), slo_class="interactive")  # fmt: skip
    r2a = request("r2", 1.0, input_tokens=600, prompt_block_hashes=(11,))
    r2b = r2a.model_copy(update={"attempt": 2, "ts": T0 + 4.0, "event_id": "r2-attempt-2"})
    r3 = request("r3", 2.0, input_tokens=2048)  # no hashes: a row from before the store kept them
    r4 = request(
        "r4",
        3.0,
        slo_class="batch",
        deadline_ts=T0 + 63.0,
        output_budget=300,
        prompt_block_hashes=(21, 22, 23),
    )
    r5 = request("r5", 3.5, prompt_block_hashes=(11, 12, 99))
    sink.write_requests([r1, r2a, r2b, r3, r4, r5])
    sink.write_admission([admitted(r1), admitted(r2a), admitted(r2b), admitted(r3, slo_class="long_context"),
                          admitted(r4, "reject", "batch"), admitted(r5)])  # fmt: skip
    sink.write_routing([routed(r1), routed(r2a), routed(r2b), routed(r3, "i-b", "long_context"), routed(r5)])
    sink.write_completions([ended(r1, "ok", 120), ended(r2a, "error", 0), ended(r2b, "ok", 80),
                            ended(r3, "ok", 40), ended(r5, "aborted", 7)])  # fmt: skip
    sink.write_heartbeats([
        beat("i-a", "A", "llama3-8b-h100", 0.0, price_per_hour=9.0),
        beat("i-a", "A", "llama3-8b-h100", 5.0, price_per_hour=3.0),
        beat("i-b", "B", "qwen3-14b-h100", 1.0, gpus=2),
        beat("i-b", "B", "qwen3-14b-h100", 6.0, gpus=2),
    ])  # fmt: skip
    other = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id="run-b")
    other.write_requests([request("x1", 1.5)])
    other.write_heartbeats([beat("i-x", "C", "llama3-8b-h100", 1.0)])


def test_a_run_exports_as_a_workload_and_a_fleet_the_simulator_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"chdb:///{tmp_path / 'clickhouse'}"
    with connect(url) as client:  # closed before the command opens the store (one engine path)
        migrate(client)
        write_run(client)
    monkeypatch.setenv("TOKENFLEET_CLICKHOUSE_DSN", url)
    out = tmp_path / "replay"
    assert main(["replay", "export", "--run", RUN, "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"run {RUN}: 5 requests (1 without block hashes") and "2 instances" in line
    assert line.count("\n") == 1

    workload = load_workload(out / "workload.jsonl")
    got = {r.request_id: r for r in workload.requests}
    assert list(got) == ["r1", "r2", "r3", "r4", "r5"]  # one per request, by first arrival
    r1, r2, r3, r4, r5 = (got[f"r{i}"] for i in range(1, 6))
    assert [r.arrival_s for r in workload.requests] == [0.0, 1.0, 2.0, 3.0, 3.5]
    assert r1.block_hashes == chain_hashes([11, 12, 13], 3)
    assert (r1.tenant, r1.home_dc, r1.model_version, r1.allowed_regions) == ("t1", "A", "2", ("eu",))
    assert (r1.input_tokens, r1.output_tokens, r1.max_tokens, r1.model) == (1600, 120, 200, MODEL)
    assert r2.output_tokens == 80 and r2.block_hashes == chain_hashes([11], 1)  # its ok attempt
    assert r2.block_hashes[0] == r1.block_hashes[0]  # the shared prefix survives the export
    assert len(r3.block_hashes) == 4 and r3.slo_class == "long_context"  # the decider's class
    shared = {h for r in (r1, r2, r4, r5) for h in r.block_hashes}
    assert not shared & set(r3.block_hashes)  # no stored chain: blocks of its own
    assert (r4.output_tokens, r4.slo_class, r4.deadline_s) == (300, "batch", 60.0)  # rejected: budget
    assert r5.output_tokens == 200  # aborted: its budget, not the 7 tokens it got
    records = [json.loads(line) for line in (out / "workload.jsonl").read_text().splitlines()]
    assert [r["timestamp"] for r in records] == [0, 1000, 2000, 3000, 3500]

    text = (out / "fleet.yaml").read_text()
    fleet = fleet_from_doc(yaml.safe_load(text), out / "fleet.yaml")
    placed = sorted((s.dc, s.model, s.version, s.profile.name, s.price) for s in fleet.instances)
    assert placed == [("A", MODEL, "2", "llama3-8b-h100", 3.0), ("B", MODEL, "2", "qwen3-14b-h100", None)]
    assert "gpus: 2" in text  # the last beat describes each instance


def test_a_window_selects_requests_by_first_arrival_and_bad_runs_are_refused(client: Client) -> None:
    write_run(client)
    exported = export_run(client, RUN, since_ts=T0 + 1.0, until_ts=T0 + 3.0)
    assert [r["request_id"] for r in exported.records] == ["r2", "r3"]  # r2's retry at +4 s stays r2
    assert exported.records[0]["timestamp"] == 0 and exported.unhashed == 1
    with pytest.raises(ExportError, match="no run 'nope'"):
        export_run(client, "nope")
    with pytest.raises(ExportError, match="no request arriving in the window"):
        export_run(client, RUN, since_ts=T0 + 100.0)


def test_a_sessions_calls_that_followed_each_others_end_replay_closed_loop(client: Client) -> None:
    """A call sent after its session's previous call ended carries that gap as ``think_s`` (the
    replay sends it that long after the replayed end); one that overlapped its predecessor, or
    followed a call that never completed, keeps its recorded time, and so does a call without a
    session, whatever its tenant's other calls did."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id=RUN, run_policy="round-robin")
    times = (("a", 0.0), ("b", 2.25), ("c", 3.0))
    a, b, c = (request(rid, at, tenant="t", session_id="u1") for rid, at in times)
    d, e = request("d", 0.5, tenant="t", session_id="u2"), request("e", 4.0, tenant="t", session_id="u2")
    f, g = request("f", 5.0, tenant="t"), request("g", 9.0, tenant="t")
    sink.write_requests([a, b, c, d, e, f, g])
    sink.write_completions([ended(a, "ok", 10), ended(b, "ok", 10), ended(c, "ok", 10), ended(f, "ok", 10)])
    sink.write_heartbeats([beat("i-a", "A", "llama3-8b-h100", 0.0)])

    records = {r["request_id"]: r for r in export_run(client, RUN).records}
    assert {rid: r.get("session_id") for rid, r in records.items()} == {
        "a": "u1", "b": "u1", "c": "u1", "d": "u2", "e": "u2", "f": None, "g": None,
    }  # fmt: skip
    assert records["b"]["think_s"] == pytest.approx(0.25)  # a ended at 2.0 s (its completion)
    assert {rid for rid, r in records.items() if "think_s" in r} == {"b"}  # c overlapped b; d never ended
    loaded = {r.request_id: r for r in load_records(list(records.values()), "export").requests}
    assert loaded["b"].session_id == "u1" and loaded["b"].think_s == pytest.approx(0.25)


def test_what_an_engine_reused_past_whole_blocks_replays_as_a_prefix_tail(client: Client) -> None:
    """vLLM reuses a prefix in blocks finer than the chain's 512 tokens: a call whose engine reported
    more cached tokens than its blocks shared with earlier calls carries the excess as
    ``prefix_tail``; a call after the same prefix whose engine did not hold it, or that was
    retried, gets the median of those measured; a call after a prefix where nothing was
    measured, or sharing no block, none."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id=RUN, run_policy="round-robin")
    chain = (1, 2, 3, 4)
    first = request("first", 0.0, input_tokens=2300, prompt_block_hashes=chain)
    hit = request("hit", 1.0, input_tokens=2400, prompt_block_hashes=chain)
    missed = request("missed", 2.0, input_tokens=2350, prompt_block_hashes=chain)
    hit_again = request("hit-again", 3.0, input_tokens=2500, prompt_block_hashes=chain)
    short = request("short", 4.0, input_tokens=1200, prompt_block_hashes=chain[:2])
    retried = request("retried", 3.5, input_tokens=2300, prompt_block_hashes=chain)
    again = retried.model_copy(update={"attempt": 2, "ts": T0 + 3.8, "event_id": "retried-2"})
    calls = [first, hit, missed, hit_again, short, retried]
    sink.write_requests([*calls, again])
    cached = {"first": 0, "hit": 4 * 512 + 224, "missed": 0, "hit-again": 4 * 512 + 192, "short": 0}
    sink.write_completions([ended(r, "ok", 10, cached[r.request_id]) for r in calls[:-1]])
    # its retry found its own first attempt's prefill: 2 299 tokens, not a tail other prompts share
    sink.write_completions([ended(retried, "error", 0), ended(again, "ok", 10, 2299)])
    sink.write_heartbeats([beat("i-a", "A", "llama3-8b-h100", 0.0)])

    records = {r["request_id"]: r for r in export_run(client, RUN).records}
    assert {rid: r.get("prefix_tail") for rid, r in records.items()} == {
        "first": None, "hit": [4, 224], "missed": [4, 192], "hit-again": [4, 192], "short": None,
        "retried": [4, 192],
    }  # fmt: skip
    replayed = {r.request_id: r for r in load_records(list(records.values()), "export").requests}
    assert replayed["hit"].reusable_tokens(4) == 4 * 512 + 224
    assert replayed["hit"].reusable_tokens(3) == 3 * 512


WORDS = [f"w{i}" for i in range(64)]


def word_prompts() -> Prompts:
    """A real ``Prompts`` (the worker's and the gateway's) on a word-level tokenizer: a token per word."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = "{% for m in messages %}{{ m.content }} {% endfor %}"
    return Prompts({MODEL: PromptTokenizer(tokenizer, template, {})})


def test_the_store_keeps_a_prompts_hashes_and_never_its_text(client: Client, tmp_path: Path) -> None:
    """The log path (a text prompt published on tf.requests, e.g. an OpenAI batch line): the
    stored request is the client's, without hashes; its routing decision carries the hashes the
    worker computed. The direct path (the gateway counts and hashes, then asks with the text left
    out, as ``Gateway._decide`` does): the decider's record carries them. Neither stores text."""
    secret = "zebracorn"
    text = " ".join([secret, *(WORDS[i % 64] for i in range(1100))])  # 1101 tokens: 2 full blocks
    prompts = word_prompts()
    publisher = MemoryPublisher()
    agents = SchedulerAgents(
        RoutingService("round-robin", worker="w1"), MemoryState(), publisher, RecordingTelemetry(), prompts
    )
    by_log = InferenceRequest(request_id="log-1", model=MODEL, prompt=text, output_budget=50, reply="kafka")
    chat = InferenceRequest(
        request_id="gw-1", model=MODEL, output_budget=50, reply="http",
        messages=(ChatMessage(role="system", content=secret), ChatMessage(role="user", content=text)),
    )  # fmt: skip

    async def decide() -> InferenceRequest:
        await agents.on_heartbeats([(b"k", encode(beat("i-a", "A", "llama3-8b-h100", 0.0, ts=time.time())))])
        await (await agents.on_requests([(b"k", encode(by_log))], [(0, 0)]))
        counted = await prompts.complete_off_loop(chat)  # the gateway
        asked = counted.model_copy(update={"prompt": None, "messages": None, "prompt_token_ids": None})
        await agents.on_direct(encode(asked))
        await asyncio.sleep(0.01)  # the direct request's record is published by a task
        return counted

    counted = asyncio.run(decide())
    expected = (
        asyncio.run(prompts.complete_off_loop(by_log)).prompt_block_hashes,
        counted.prompt_block_hashes,
    )
    assert all(len(chain) == 2 for chain in expected)
    records = cast(list[InferenceRequest], publisher.sent[topics.REQUESTS.name])  # the direct one's
    admissions = cast(list[AdmissionDecision], publisher.sent[topics.ADMISSION.name])
    decisions = cast(list[RoutingDecision], publisher.sent[topics.DECISIONS.name])
    # tf.requests holds the client's own message (log path) and the decider's record (direct path).
    on_the_log = [decode(InferenceRequest, encode(by_log)), *records]
    assert on_the_log[0].prompt_block_hashes == () and on_the_log[1].prompt_block_hashes == expected[1]
    assert any(d.request.prompt and secret in d.request.prompt for d in decisions)  # the bus carries it
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0, run_id=RUN)
    sink.write_requests(on_the_log)
    sink.write_admission(admissions)
    sink.write_routing(decisions)
    sink.write_heartbeats([beat("i-a", "A", "llama3-8b-h100", 0.0, ts=time.time())])

    assert columns_holding(client, secret) == []
    assert "requests.request_id" in columns_holding(client, "log-1")  # the scan finds what is stored
    rows = client.query("SELECT request_id, prompt_block_hashes FROM requests FINAL").result_rows
    stored = {str(rid): list(chain) for rid, chain in rows}
    assert stored == {"log-1": [], "gw-1": list(expected[1])}
    exported = export_run(client, RUN)
    chains = {r["request_id"]: tuple(r["hash_ids"]) for r in exported.records}
    assert chains == {"log-1": expected[0], "gw-1": expected[1]} and exported.unhashed == 0
    assert {r["request_id"]: r["input_length"] for r in exported.records} == {"log-1": 1101, "gw-1": 1102}
    assert secret not in json.dumps(exported.records) + json.dumps(exported.fleet)


def columns_holding(client: Client, needle: str) -> list[str]:
    """Every ``table.column`` of the store (strings, arrays and maps included) whose value holds
    ``needle``."""
    columns: dict[str, list[str]] = {}
    for table, column in client.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() ORDER BY table, name"
    ).result_rows:
        columns.setdefault(str(table), []).append(str(column))
    found = []
    for table, names in columns.items():
        hits = ", ".join(f"countIf(position(toString(`{n}`), {{needle:String}}) > 0)" for n in names)
        counts = client.query(f"SELECT {hits} FROM `{table}`", parameters={"needle": needle}).result_rows[0]
        found += [f"{table}.{n}" for n, count in zip(names, counts, strict=True) if count]
    return found
