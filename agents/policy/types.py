"""The seam of the pure core: what the scheduler's stages read, return and observe.

Everything here is plain data. The simulator (``sim/``) and the streaming service (``agents/``)
build the same objects, so no stage can tell which of them is driving it.

What a stage may see is exactly what a real router sees: the request as the client sent it
(never its true output length), heartbeat snapshots of the instances (stale by up to one
heartbeat interval, each with an explicit ``version``), its own past decisions, and the
observations a proxying router gets: the first token of each response, the end of each
response, and, for stages that set ``wants_kv_events``, the instances' KV-cache events. Where
several deciders serve one pool, each also observes the others' placements (``Placed``), read
from the decision log a little late.

Names: these are the *policy-side* views. The wire events they are made from live in
``schemas.events`` (``Heartbeat``, ``Completion``, ``KvEvent``, ...) and have other names, so a
reader always knows which side of the seam a value is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

BLOCK_TOKENS = 512
"""KV-cache block size in tokens; prompt block hashes are computed per full block of this size."""

ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH = "prefill", "decode", "both"
"""An instance's part in prefill/decode disaggregation (``ClusterView.role``)."""
ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH)

AdmissionAction = Literal["admit", "queue", "reject"]
OutcomeStatus = Literal["ok", "timeout", "aborted", "error", "rejected"]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RequestView:
    """One attempt of a request, as the scheduler receives it.

    ``block_hashes`` are chained hashes of the prompt's full 512-token blocks: equal hash at
    position i means the whole prefix up to block i is equal. ``output_budget`` is the client's
    ``max_tokens`` cap, not the (unknowable) true output length. ``arrival_s`` and
    ``deadline_s`` are absolute times on the driver's clock (seconds). ``allowed_regions``: the
    data centres the request may run in (empty = any); ``home_dc``: where it entered the fleet
    (empty = no preference); ``model_version``: the version of ``model`` it must run on (empty =
    whatever the DC selection's rules pin for the model).
    """

    request_id: str
    attempt: int
    tenant: str
    model: str
    slo_class: str
    input_tokens: int
    output_budget: int
    block_hashes: tuple[int, ...]
    arrival_s: float
    deadline_s: float | None = None
    task_type: str = "chat"
    allowed_regions: tuple[str, ...] = ()
    home_dc: str = ""
    model_version: str = ""

    @property
    def key(self) -> tuple[str, int]:
        """(request id, attempt): one attempt's identity everywhere in the scheduler."""
        return (self.request_id, self.attempt)


@dataclass(frozen=True, slots=True)
class DcView:
    """The data centres as seen from the scheduler's ingress, one entry per DC name.

    ``rtt_s``: network round trip from the ingress (seconds; 0 for the ingress itself);
    ``reachable``: False once contact is lost (the DC's instances are then not candidates).
    """

    names: tuple[str, ...] = ()
    rtt_s: tuple[float, ...] = ()
    reachable: tuple[bool, ...] = ()
    kv_link_gbps: tuple[float, ...] = ()  # per DC; () or 0: no link for moving KV caches

    def rtt(self, dc: str) -> float:
        """Round trip to ``dc`` (0 when unknown)."""
        return self.rtt_s[self.names.index(dc)] if dc in self.names else 0.0

    def link_gbps(self, dc: str) -> float:
        """Gigabits per second of ``dc``'s link between prefill and decode instances (0: none,
        or unknown: the DC's instances cannot serve a request disaggregated)."""
        if dc not in self.names or not self.kv_link_gbps:
            return 0.0
        return self.kv_link_gbps[self.names.index(dc)]

    def is_reachable(self, dc: str) -> bool:
        """Unknown DCs count as reachable: the scheduler has no evidence against them."""
        return self.reachable[self.names.index(dc)] if dc in self.names else True


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Struct-of-arrays snapshot of the instances, one row per instance, built from heartbeats.

    ``version`` identifies the snapshot: two views with the same version have the same contents,
    and a newer snapshot always has a higher version. Stages key their once-per-snapshot work
    on it (never on object identity). Counts are as of each instance's last heartbeat
    (``last_heartbeat_s``); requests routed since then are not in them, which is why stages keep
    their own in-flight accounting. ``kv_used`` / ``kv_total`` are in blocks of
    ``BLOCK_TOKENS``. ``profile`` names the engine profile (hardware + model), so heterogeneous
    pools can be compared by predicted latency; ``dc`` and ``version_of_model`` say where each
    instance is and which model version it serves.

    Prefill/decode disaggregation: ``role`` is each instance's ``prefill``, ``decode`` or
    ``both`` (default: every row ``both``); a ``prefill`` instance only prefills the requests of
    a pair (``Placement.prefill_instance``), never serves one whole. ``kv_bytes_per_token``: the
    KV cache one prompt token occupies on the row's model (what a transfer moves; 0: unknown).
    """

    version: int
    instance_ids: tuple[str, ...]
    dc: npt.NDArray[np.str_]
    model: npt.NDArray[np.str_]
    model_version: npt.NDArray[np.str_]
    profile: npt.NDArray[np.str_]
    ready: BoolArray
    waiting: npt.NDArray[np.int64]
    running: npt.NDArray[np.int64]
    tokens_in_flight: npt.NDArray[np.int64]
    kv_used: npt.NDArray[np.int64]
    kv_total: npt.NDArray[np.int64]
    last_heartbeat_s: npt.NDArray[np.float64]
    dcs: DcView = field(default_factory=DcView)
    role: npt.NDArray[np.str_] = field(default_factory=lambda: np.zeros(0, dtype=str))
    kv_bytes_per_token: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    index_of: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index_of", {iid: i for i, iid in enumerate(self.instance_ids)})
        n = len(self.instance_ids)
        if len(self.role) != n:
            object.__setattr__(self, "role", np.full(n, ROLE_BOTH))
        if len(self.kv_bytes_per_token) != n:
            object.__setattr__(self, "kv_bytes_per_token", np.zeros(n, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.instance_ids)

    def reachable_rows(self) -> BoolArray:
        """Rows in a DC the scheduler has contact with (``DcView.is_reachable``)."""
        lost = [dc for dc, up in zip(self.dcs.names, self.dcs.reachable, strict=True) if not up]
        return ~np.isin(self.dc, lost) if lost else np.ones(len(self), dtype=bool)

    def serving_rows(self, request: RequestView) -> BoolArray:
        """Ready rows of the request's model, and of its ``model_version`` if it names one, that
        serve a request whole (role ``decode`` or ``both``): the wire contract (no substitution)
        every DC-selection stage starts from."""
        rows: BoolArray = self._model_rows(request) & (self.role != ROLE_PREFILL)
        return rows

    def prefill_rows(self, request: RequestView) -> BoolArray:
        """Ready rows of the request's model (and version) that may prefill it for another
        instance to decode (role ``prefill`` or ``both``), in a DC with a KV link; none on a
        fleet without one."""
        linked = [dc for dc, gbps in zip(self.dcs.names, self.dcs.kv_link_gbps, strict=False) if gbps > 0]
        if not linked:
            return np.zeros(len(self), dtype=bool)
        rows: BoolArray = self._model_rows(request) & (self.role != ROLE_DECODE) & np.isin(self.dc, linked)
        return rows

    def _model_rows(self, request: RequestView) -> BoolArray:
        rows: BoolArray = self.ready & (self.model == request.model)
        if request.model_version:
            rows &= self.model_version == request.model_version
        return rows


@dataclass(frozen=True, slots=True)
class Admission:
    """The admission stage's answer for one request.

    ``queue`` holds the request in the named ``pool`` until a later snapshot; ``reject`` ends
    it with ``reason`` (its code first: ``cannot_meet_slo: ...``); ``predicted_ttft_s`` is the
    prediction the answer was based on, if any; ``retry_after_s`` (rejects) when trying again
    could succeed (None: no hint). ``candidates`` (admits): the rows the request may run on,
    a capacity share over the view (None: any row the DC selection allows); shared, read-only.
    """

    action: AdmissionAction
    reason: str = ""
    pool: str = ""
    predicted_ttft_s: float | None = None
    retry_after_s: float | None = None
    candidates: BoolArray | None = None


@dataclass(frozen=True, slots=True)
class RowPrediction:
    """A router's prediction for a request were it sent now, per row of the view: ``ttft_s``
    its time to first token on that row, of which ``own_s`` its own prefill (what it would take
    on an idle instance; the rest waits for work queued ahead). Seconds; read-only. ``per_row``
    False: a pool estimate, not a router's, the same on every row that serves the model."""

    ttft_s: FloatArray
    own_s: FloatArray
    per_row: bool = True


@runtime_checkable
class RowPredictor(Protocol):
    """A router that predicts TTFT per row (TokenPilot): what SLOMax admits by and FleetMind
    compares data centres by."""

    def predict_rows(self, request: RequestView, view: ClusterView, now_s: float) -> RowPrediction: ...


@dataclass(frozen=True, slots=True)
class DcChoice:
    """The DC-selection stage's answer: the candidate rows for instance selection.

    ``candidates`` is a mask over the view's rows (ready instances of the request's model in the
    chosen data centre(s)); it is shared and must not be mutated. An empty mask means no
    allowed DC can serve the request now (it is held until a snapshot shows capacity), unless
    ``reject`` is set: no allowed DC could ever serve it (the rules forbid every DC that has the
    model version), so it is rejected at once with ``reason`` (its code first).
    """

    dc: str
    candidates: BoolArray
    reason: str = ""
    reject: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    """The instance-selection stage's answer: a row of the view, why, and its prediction."""

    instance: int
    reason: str
    predicted_ttft_s: float | None = None
    prefill_instance: int = -1  # >= 0: disaggregated, prefilled on this row, decoded on ``instance``


@dataclass(frozen=True, slots=True)
class Outcome:
    """The scheduler's decision for one request attempt (one per offer that settles it, or the
    first time it is held).

    ``action`` ``admit`` comes with the ``dc``, the view row ``instance`` and ``instance_id`` it
    runs on (a disaggregated request decodes there, after ``prefill_instance`` /
    ``prefill_instance_id`` prefilled it; -1 / "": it runs whole on ``instance``); ``queue``
    (only when first held) says which ``pool`` holds it; ``reject`` ends it. ``reason`` and
    ``predicted_ttft_s`` are from the stage that settled it (``admission_reason`` from admission).
    """

    request: RequestView
    action: AdmissionAction
    reason: str
    admission_reason: str = ""
    pool: str = ""
    dc: str = ""
    instance: int = -1
    instance_id: str = ""
    predicted_ttft_s: float | None = None
    retry_after_s: float | None = None
    prefill_instance: int = -1
    prefill_instance_id: str = ""


def empty_view(version: int = 0) -> ClusterView:
    """A snapshot with no instance (nothing has reported yet): every request is held."""
    none = np.zeros(0, dtype=np.int64)
    names = np.zeros(0, dtype=str)
    return ClusterView(
        version, (), names, names, names, names, np.zeros(0, dtype=bool),
        none, none, none, none, none, np.zeros(0),
    )  # fmt: skip


# --- observations: what a proxying router sees of a response ----------------------------------


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The first byte of a response reached the router (its prefill is done)."""

    request_id: str
    attempt: int
    instance_id: str
    ttft_s: float
    time_s: float


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """The prefill of a disaggregated request ended on ``instance_id`` (its prefill
    instance), ``ttft_s`` after the request's arrival; its KV cache now moves to the decode
    instance, whose first token and end come later as ``FirstToken`` and ``Finished``."""

    request_id: str
    attempt: int
    instance_id: str
    ttft_s: float
    time_s: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of one request attempt, as the router sees the response stream close."""

    request_id: str
    attempt: int
    instance_id: str
    status: OutcomeStatus
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    time_s: float


@dataclass(frozen=True, slots=True)
class BlocksChanged:
    """Blocks stored in or removed from one instance's prefix cache (a KV-cache event)."""

    instance_id: str
    kind: Literal["stored", "removed"]
    block_hashes: tuple[int, ...]
    time_s: float


@dataclass(frozen=True, slots=True)
class Placed:
    """Another decider of the same pool placed ``request`` on ``instance_id`` at ``time_s``.

    Several deciders serve one pool, each reading the others' placements from the decision log
    (``tf.decisions``) a few milliseconds late. A stage applies one to its in-flight accounting
    exactly as it applies its own placements, until heartbeats reconcile; never one of its own
    (the caller filters those out). The request's first token, end and KV events arrive later
    as for its own sends.
    """

    request: RequestView
    instance_id: str
    time_s: float
    predicted_ttft_s: float | None = None  # its decider's prediction, if it made one


@dataclass(frozen=True, slots=True)
class HeldElsewhere:
    """Another decider of the same pool began holding a request of ``slo_class`` at ``time_s``
    (read from the admission log, ``tf.admission``, a few milliseconds late; never one of this
    decider's own holds). The hold ends with the request's ``Placed``, or at the latest once its
    class's objective has passed since ``time_s`` (a held request is rejected when it can no
    longer meet it). An admission stage that yields to waiting work (SLOMax's calm test) counts
    the pool's holds, not only its own; one that keeps the pool's serving order (SLOMax) leaves
    room for the older holds of the deciders that offer after it (a later ``lane``)."""

    request_id: str
    attempt: int
    slo_class: str
    time_s: float
    input_tokens: int = 0  # its prompt's size (0: not said)
    lane: int | None = None  # the holder's lane among the pool's deciders (None: not known)

    @property
    def key(self) -> tuple[str, int]:
        return (self.request_id, self.attempt)


Observation = FirstToken | Finished | BlocksChanged | Placed | HeldElsewhere | PrefillDone
