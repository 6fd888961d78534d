"""A worker's decisions survive into its next process: saved, read back, answered again."""

from __future__ import annotations

import time
from pathlib import Path

from agents.routing import RoutingService
from schemas.events import Heartbeat, InferenceRequest
from streams.snapshot import SnapshotCache
from worker import decision_memory


def view_of_beats(beats: list[Heartbeat]):  # type: ignore[no-untyped-def]
    state = SnapshotCache()
    for beat in beats:
        state.record(beat)
    return state.view(beats[0].model)


BEAT = Heartbeat(
    instance_id="i-1", dc="dc-1", model="m", model_version="1", profile="llama3-8b-h100",
    waiting=0, running=0, tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=1000,
)  # fmt: skip


def test_a_resend_to_the_next_process_gets_the_decision_the_previous_one_made(tmp_path: Path) -> None:
    path = tmp_path / decision_memory.FILE_NAME
    before = RoutingService("least-request", worker="w:1")
    beat = BEAT
    sent = InferenceRequest(request_id="r", model="m", input_tokens=10, output_budget=4)
    [routed] = before.route("m", [sent], view_of_beats([beat]), time.time())
    assert routed.routing is not None
    decision_memory.save(path, before.answers())

    after = RoutingService("least-request", worker="w:2")
    assert after.restore(decision_memory.load(path)) == 1
    assert after.route("m", [sent], view_of_beats([beat]), time.time()) == []  # not decided again
    [again] = after.answers_again("m", [sent])
    assert again.routing is not None and again.admission is not None
    assert (again.routing.event_id, again.routing.instance_id) == (routed.routing.event_id, "i-1")
    assert again.routing.request == sent and again.admission.event_id == routed.admission.event_id


def test_old_or_unreadable_memories_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / decision_memory.FILE_NAME
    assert decision_memory.load(path) == []
    path.write_text("{not json\n")
    assert decision_memory.load(path) == []
    service = RoutingService("least-request")
    request = InferenceRequest(request_id="r", model="m", input_tokens=10, output_budget=4)
    service.route("m", [request], view_of_beats([BEAT]), time.time())
    decision_memory.save(path, service.answers())
    assert len(decision_memory.load(path)) == 1
    time.sleep(0.01)
    assert decision_memory.load(path, max_age_s=0.0) == []  # made before the last 0 s
