"""The snapshot cache: same view and version until a heartbeat changes the pool."""

from __future__ import annotations

from typing import Any

from schemas.events import Heartbeat
from streams.snapshot import SnapshotCache


def beat(instance: str, running: int = 0, ts: float = 1.0, version: str = "1") -> Heartbeat:
    return Heartbeat(
        ts=ts, instance_id=instance, dc="dc-1", model="m", model_version=version, profile="p",
        waiting=0, running=running, tokens_in_flight=10 * running, kv_blocks_used=1, kv_blocks_total=100,
    )  # fmt: skip


def table_of(*beats: Heartbeat) -> dict[str, dict[str, Any]]:
    return {"m": {b.instance_id: b.model_dump(mode="json") for b in beats}}


def test_view_is_reused_until_a_heartbeat_changes_it_and_old_views_stay_as_they_were() -> None:
    table = table_of(beat("b"), beat("a"))
    cache = SnapshotCache()
    first = cache.view("m", table.__getitem__)
    assert first is not None and first.instance_ids == ("a", "b")  # sorted by instance id
    assert cache.view("m", table.__getitem__) is first
    cache.update(beat("b", running=3, ts=2.0))
    second = cache.view("m", table.__getitem__)
    assert second is not None and second.version > first.version
    assert second.running.tolist() == [0, 3] and second.last_heartbeat_s.tolist() == [1.0, 2.0]
    assert first.running.tolist() == [0, 0]  # a view handed out is never mutated


def test_a_new_instance_or_identity_rebuilds_the_pool() -> None:
    table = table_of(beat("b"))
    cache = SnapshotCache()
    cache.view("m", table.__getitem__)
    cache.update(beat("a", running=2))
    view = cache.view("m", table.__getitem__)
    assert view is not None and view.instance_ids == ("a", "b") and view.running.tolist() == [2, 0]
    cache.update(beat("b", version="2"))
    view = cache.view("m", table.__getitem__)
    assert view is not None and view.model_version.tolist() == ["1", "2"]


def test_unknown_pool_reads_the_table_once_and_clear_forgets() -> None:
    reads: list[str] = []

    def table(pool: str) -> dict[str, dict[str, Any]]:
        reads.append(pool)
        return table_of(beat("a")).get(pool, {})

    cache = SnapshotCache()
    assert cache.view("other", table) is None
    assert cache.view("m", table) is not None and cache.view("m", table) is not None
    assert reads == ["other", "m"]
    cache.clear()
    cache.view("m", table)
    assert reads == ["other", "m", "m"]
