"""The instance state: every pool's latest heartbeats, and its ``ClusterView`` rebuilt only
when a heartbeat changed it.

Every decider reads ``tf.heartbeats`` whole (``streams.shared_log``), from a few seconds back
when it starts, so the latest heartbeat of each instance is the truth and nothing needs to be
recovered from a changelog. Validating every entry of a large pool into a view per request batch
is far too slow (docs/results/speed.md): ``SnapshotCache`` keeps, per pool, the columns of the
view as numpy arrays and updates one row in place per heartbeat (O(1)); ``view(pool)`` returns
the same view object, with the same ``version``, until a heartbeat changes the pool, and
otherwise copies the columns into a new view with a new version (a view handed out is never
mutated). A heartbeat that adds an instance or changes its identity (DC, model, version,
profile, role, KV bytes per token) rebuilds the pool's columns, rows sorted by instance id so
the same heartbeats always give the same row order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import numpy as np
import numpy.typing as npt

from agents.policy.types import ClusterView, DcView
from schemas.events import Heartbeat

_NUMBERS = ("waiting", "running", "tokens_in_flight", "kv_blocks_used", "kv_blocks_total")
_VERSIONS = count(1)  # process-wide: a rebuilt pool never reuses an older snapshot's version


@dataclass(slots=True)
class _Columns:
    """A pool's view columns, staged for the next view (rows sorted by instance id)."""

    instance_ids: tuple[str, ...]
    row_of: dict[str, int]
    identity: list[tuple[str, str, str, str, str, int]]  # per row: ``_identity``
    dc: npt.NDArray[np.str_]
    model: npt.NDArray[np.str_]
    model_version: npt.NDArray[np.str_]
    profile: npt.NDArray[np.str_]
    role: npt.NDArray[np.str_]
    kv_bytes_per_token: npt.NDArray[np.int64]
    ready: npt.NDArray[np.bool_]
    numbers: npt.NDArray[np.int64]  # rows x _NUMBERS
    last_heartbeat_s: npt.NDArray[np.float64]
    view: ClusterView | None = None  # the latest view built; None = changed since
    beats: dict[str, Heartbeat] = field(default_factory=dict)


class SnapshotCache:
    """``agents.ports.InstanceState``: per-pool views over heartbeats; see the module docstring.
    ``dcs``: the static DC view (round trips from the ingress), attached to every view."""

    def __init__(self, dcs: DcView | None = None) -> None:
        self.dcs = dcs or DcView()
        self._pools: dict[str, _Columns] = {}

    def record(self, beat: Heartbeat) -> None:
        """Take ``beat`` as its instance's latest state (one row written in place)."""
        pool = self._pools.get(beat.model)
        if pool is None:
            self._pools[beat.model] = _columns({beat.instance_id: beat})
            return
        row = pool.row_of.get(beat.instance_id)
        pool.beats[beat.instance_id] = beat
        if row is None or pool.identity[row] != _identity(beat):
            self._pools[beat.model] = _columns(pool.beats)
            return
        pool.ready[row] = _takes_requests(beat)
        pool.numbers[row] = [getattr(beat, name) for name in _NUMBERS]
        pool.last_heartbeat_s[row] = beat.ts
        pool.view = None

    def view(self, pool: str) -> ClusterView | None:
        """The pool's current view (None if no instance of it reported)."""
        columns = self._pools.get(pool)
        if columns is None:
            return None
        if columns.view is None:
            columns.view = self._build(columns)
        return columns.view

    def _build(self, c: _Columns) -> ClusterView:
        numbers = c.numbers.T.copy()
        return ClusterView(
            version=next(_VERSIONS),
            instance_ids=c.instance_ids,
            dc=c.dc,
            model=c.model,
            model_version=c.model_version,
            profile=c.profile,
            ready=c.ready.copy(),
            waiting=numbers[0],
            running=numbers[1],
            tokens_in_flight=numbers[2],
            kv_used=numbers[3],
            kv_total=numbers[4],
            last_heartbeat_s=c.last_heartbeat_s.copy(),
            dcs=self.dcs,
            role=c.role,
            kv_bytes_per_token=c.kv_bytes_per_token,
        )


def _columns(beats: dict[str, Heartbeat]) -> _Columns:
    """Fresh columns for a pool from its latest heartbeats (the string columns are shared by
    every view until the pool's membership or identities change, and never written)."""
    ordered = [beats[iid] for iid in sorted(beats)]
    ids = tuple(b.instance_id for b in ordered)
    return _Columns(
        instance_ids=ids,
        row_of={iid: row for row, iid in enumerate(ids)},
        identity=[_identity(b) for b in ordered],
        dc=np.array([b.dc for b in ordered], dtype=str),
        model=np.array([b.model for b in ordered], dtype=str),
        model_version=np.array([b.model_version for b in ordered], dtype=str),
        profile=np.array([b.profile for b in ordered], dtype=str),
        role=np.array([b.role for b in ordered], dtype=str),
        kv_bytes_per_token=np.array([b.kv_bytes_per_token for b in ordered], dtype=np.int64),
        ready=np.array([_takes_requests(b) for b in ordered], dtype=bool),
        numbers=np.array([[getattr(b, n) for n in _NUMBERS] for b in ordered], dtype=np.int64).reshape(
            len(ordered), len(_NUMBERS)
        ),
        last_heartbeat_s=np.array([b.ts for b in ordered], dtype=np.float64),
        beats=dict(beats),
    )


def _identity(beat: Heartbeat) -> tuple[str, str, str, str, str, int]:
    """What a row is, as opposed to its load: a change rebuilds the pool's columns."""
    return (beat.dc, beat.model, beat.model_version, beat.profile, beat.role, beat.kv_bytes_per_token)


def _takes_requests(beat: Heartbeat) -> bool:
    """A row is ready when its endpoint answers and it is not draining (a draining instance
    finishes what it runs and gets nothing new)."""
    return beat.endpoint_ready and not beat.draining
