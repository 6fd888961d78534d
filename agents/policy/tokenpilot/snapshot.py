"""What a TokenPilot decision reads of one cluster snapshot: its rows' engine profiles and counts,
what only an observation changes (θ, the step clock, the decode horizon, the lateness), and the
arrays a decision computes into. Prepared once per snapshot version and reused by every decision
on it, so a burst decided on one snapshot pays for it once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from agents.policy.common.numeric import BoolArray, FloatArray, IntArray


class RowFeatures(NamedTuple):
    """What ``TokenPilot._features`` computes per row of the view for one request
    (``kernels.row_features``)."""

    features: FloatArray  # n x len(FEATURES)
    # 5 x n: its own uncached prompt tokens P_i and their attention token pairs; B_i, requests
    # running (heartbeat + own sends since); C_i, their context tokens; s_i, a decode step there
    rows: FloatArray
    thetas: FloatArray  # θ of each profile of the view (``ViewRows.profiles.names``), one row each

    @property
    def new(self) -> FloatArray:
        new: FloatArray = self.rows[0]
        return new

    @property
    def pairs(self) -> FloatArray:
        pairs: FloatArray = self.rows[1]
        return pairs


@dataclass(frozen=True, slots=True)
class Profiles:
    """The engine profiles of a view's rows: ``names`` (sorted; the rows of the θ matrix a
    kernel reads), each row's index into them, the rows of each (one slice if uniform) and each
    row's name."""

    column: npt.NDArray[np.str_]  # the view's profile column they were read from
    names: tuple[str, ...]
    of_row: IntArray
    groups: list[tuple[str, slice | IntArray]]
    by_row: list[str]

    @classmethod
    def of(cls, column: npt.NDArray[np.str_]) -> Profiles:
        unique, inverse = np.unique(column, return_inverse=True)
        names = tuple(str(name) for name in unique)
        of_row = np.array(inverse, dtype=np.int64).reshape(len(column))
        if len(names) == 1:
            groups: list[tuple[str, slice | IntArray]] = [(names[0], slice(None))]
        else:
            groups = [(name, np.flatnonzero(of_row == k)) for k, name in enumerate(names)]
        return cls(column, names, of_row, groups, [names[k] for k in of_row.tolist()])


@dataclass(frozen=True, slots=True)
class ViewRows:
    """What the kernels read of one snapshot, prepared once per ``view.version``: its counts as
    contiguous int64 arrays (one compiled kernel for every way a view is built) and its rows'
    engine profiles."""

    version: int
    profiles: Profiles
    counts: IntArray  # 3 x n: requests running, tokens in flight, KV blocks free (heartbeat's)


@dataclass(frozen=True, slots=True)
class Fixed:
    """What every decision on one snapshot reads that only an observation changes (θ, the step
    clock's scale, the decode horizon, the lateness): gathered once, not per request of a
    batch. ``clock``: the step clock's slot of each row and its columns (``StepClock.columns``)."""

    version: int
    observed: int  # ``TokenPilot._observed`` when gathered (the ends learnt from)
    rows: ViewRows
    thetas: FloatArray
    scales: FloatArray  # the step clock's, per profile
    clock: tuple[IntArray, FloatArray, FloatArray, IntArray, BoolArray, FloatArray]
    lateness: FloatArray  # ``PrefillLateness.ratio``
    horizon_s: float  # H of the decode-harm term


class Scratch(NamedTuple):
    features: FloatArray  # n x len(FEATURES)
    rows: FloatArray  # 5 x n (``RowFeatures.rows``)
    scores: FloatArray  # 3 x n: the first chunk joining, its own prefill seconds, the score
    near: IntArray  # the rows near the lowest score
