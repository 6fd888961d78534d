"""The snapshot cache: same view and version until a heartbeat changes the pool."""

from __future__ import annotations

from schemas.events import Heartbeat
from streams.snapshot import SnapshotCache


def beat(instance: str, running: int = 0, ts: float = 1.0, version: str = "1") -> Heartbeat:
    return Heartbeat(
        ts=ts, instance_id=instance, dc="dc-1", model="m", model_version=version, profile="p",
        waiting=0, running=running, tokens_in_flight=10 * running, kv_blocks_used=1, kv_blocks_total=100,
    )  # fmt: skip


def test_view_is_reused_until_a_heartbeat_changes_it_and_old_views_stay_as_they_were() -> None:
    cache = SnapshotCache()
    cache.record(beat("b"))
    cache.record(beat("a"))
    first = cache.view("m")
    assert first is not None and first.instance_ids == ("a", "b")  # sorted by instance id
    assert cache.view("m") is first
    cache.record(beat("b", running=3, ts=2.0))
    second = cache.view("m")
    assert second is not None and second.version > first.version
    assert second.running.tolist() == [0, 3] and second.last_heartbeat_s.tolist() == [1.0, 2.0]
    assert first.running.tolist() == [0, 0]  # a view handed out is never mutated


def test_a_new_instance_or_identity_rebuilds_the_pool() -> None:
    cache = SnapshotCache()
    cache.record(beat("b"))
    cache.view("m")
    cache.record(beat("a", running=2))
    view = cache.view("m")
    assert view is not None and view.instance_ids == ("a", "b") and view.running.tolist() == [2, 0]
    cache.record(beat("b", version="2"))
    view = cache.view("m")
    assert view is not None and view.model_version.tolist() == ["1", "2"]


def test_a_pool_no_instance_reported_has_no_view() -> None:
    cache = SnapshotCache()
    assert cache.view("other") is None
    cache.record(beat("a"))
    assert cache.view("other") is None and cache.view("m") is not None


def test_roles_and_kv_sizes_are_view_columns_and_a_role_change_rebuilds_the_pool() -> None:
    cache = SnapshotCache()
    cache.record(beat("a").model_copy(update={"role": "prefill", "kv_bytes_per_token": 2048}))
    cache.record(beat("b"))  # an instance that does not say: both, size unknown
    view = cache.view("m")
    assert view is not None
    assert view.role.tolist() == ["prefill", "both"] and view.kv_bytes_per_token.tolist() == [2048, 0]
    cache.record(beat("b", running=2).model_copy(update={"role": "decode", "kv_bytes_per_token": 2048}))
    changed = cache.view("m")
    assert changed is not None and changed.version > view.version
    assert changed.role.tolist() == ["prefill", "decode"]
    assert changed.kv_bytes_per_token.tolist() == [2048, 2048]
    assert changed.running.tolist() == [0, 2]
    assert view.role.tolist() == ["prefill", "both"]  # the view handed out is unchanged
