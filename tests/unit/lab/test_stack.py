"""The lab stack's contracts that need no broker: worker settings, what collectors keep, and the
order ``Stack.close`` stops things in (a failing step does not stop the rest)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from lab.faults.clients import Collector as FaultCollector
from lab.stack import Stack, ValueCollector, WorkerOptions, heartbeat
from schemas.codec import encode
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ


def test_worker_options_set_only_what_is_given_and_the_extra_environment_wins() -> None:
    assert WorkerOptions(web_port=None).settings() == {}
    assert WorkerOptions().settings() == {"TOKENFLEET_WORKER_WEB_PORT": "0"}  # any free port
    options = WorkerOptions(
        policy="tokenpilot",
        app_id="app",
        clickhouse="",
        partitions=4,
        run_id="r1",
        env={"TOKENFLEET_POLICY": "slomax+tokenpilot", "PYTHONPATH": "/x"},
    )
    assert options.settings() == {
        "TOKENFLEET_POLICY": "slomax+tokenpilot",  # env is applied last
        "TOKENFLEET_APP_ID": "app",
        "TOKENFLEET_CLICKHOUSE_DSN": "",  # "" is a value (the embedded store), not "unset"
        "TOKENFLEET_WORKER_WEB_PORT": "0",
        "TOKENFLEET_TOPIC_PARTITIONS": "4",
        "TOKENFLEET_RUN_ID": "r1",
        "PYTHONPATH": "/x",
    }


def _record(value: bytes, key: bytes | None = None, timestamp_ms: int = 1_000) -> SimpleNamespace:
    return SimpleNamespace(value=value, key=key, timestamp=timestamp_ms, partition=0)


def test_a_value_collector_keeps_only_its_keys_in_order() -> None:
    collector = ValueCollector("127.0.0.1:9", DECISIONS, b"a", b"b")  # never started
    collector.take(DECISIONS.name, [_record(b"1", b"a"), _record(b"2", b"x"), _record(b"3", b"b")], 0.0)
    collector.take(DECISIONS.name, [_record(b"4", None), _record(b"5", b"a")], 0.0)
    assert collector.values == [b"1", b"3", b"5"]
    assert asyncio.run(collector.wait_for(2, timeout_s=0.1)) == [b"1", b"3", b"5"]


def test_the_fault_collector_keeps_each_topic_and_counts_what_it_cannot_read() -> None:
    collector = FaultCollector("127.0.0.1:9")  # never started
    decision = b'{"request_id": "r", "attempt": 1, "worker": "w", "event_id": "e1"}'
    collector.take(DECISIONS.name, [_record(decision, timestamp_ms=2_500), _record(b"{not json")], 0.0)
    collector.take(ADMISSION.name, [_record(b'{"request_id": "r", "attempt": 2, "action": "queue"}')], 0.0)
    collector.take(
        COMPLETIONS.name,
        [_record(b'{"request_id": "r", "attempt": 1, "event_id": "c", "status": "ok"}')],
        0.0,
    )
    collector.take(
        DLQ.name, [_record(b'{"original_sha256": "h", "source_topic": "tf.requests", "reason": "x"}')], 0.0
    )
    [decided] = collector.decisions
    assert (decided.key, decided.at, decided.worker, decided.event_id) == (("r", 1), 2.5, "w", "e1")
    assert collector.admissions == [(("r", 2), "queue")]
    assert collector.completions == [(("r", 1), "c", "ok")]
    assert collector.dead_letters == [("h", "tf.requests", "x")]
    assert collector.undecodable == 1
    assert collector.decided({("r", 1)}) == 1 and collector.completed({("r", 2)}) == 0


def test_heartbeat_is_an_idle_ready_instance_stamped_when_made() -> None:
    beat = heartbeat("m", "i-1", waiting=3, dc="dc-2", kv_blocks_total=4096)
    assert (beat.model, beat.instance_id, beat.dc, beat.waiting, beat.kv_blocks_total) == (
        "m",
        "i-1",
        "dc-2",
        3,
        4096,
    )
    assert beat.running == 0 and beat.kv_blocks_used == 0
    assert heartbeat("m", "i-1").event_id != heartbeat("m", "i-1").event_id  # each a new event
    assert encode(beat)  # a valid wire event


class _Part:
    def __init__(self, name: str, stopped: list[str], fails: bool = False) -> None:
        self.name, self.stopped, self.fails = name, stopped, fails

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopped.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} failed to stop")


def test_close_stops_publishers_first_and_collectors_last_and_never_raises(tmp_path: Path) -> None:
    stopped: list[str] = []
    logged: list[str] = []

    async def scenario() -> None:
        stack = Stack(tmp_path, log=logged.append)
        await stack.add_collector(_Part("collector", stopped))
        await stack.add_publisher(_Part("publisher", stopped, fails=True))
        await stack.close()
        await stack.close()  # a second close has nothing left to stop

    asyncio.run(scenario())
    assert stopped == ["publisher", "collector"]
    assert logged == ["cleanup step failed: RuntimeError: publisher failed to stop"]


def test_a_stack_on_a_given_broker_never_stops_it(tmp_path: Path) -> None:
    stack = Stack(tmp_path, bootstrap="127.0.0.1:9")
    assert stack.bootstrap == "127.0.0.1:9" and stack.given_broker
    stack.stop_broker()  # nothing was started here: nothing to stop
    assert not stack.broker.running
