"""The scheduler: one request's way through admission -> DC selection -> instance selection.

The simulator and the streaming service drive the same ``Scheduler``, so a simulated result is
a statement about the shipped code. It owns the queue pools:

- ``submit(requests, view, now)`` offers new arrivals; ``tick(view, now)`` offers the held
  requests again, whenever ``view.version`` differs from the snapshot they were last offered
  on. A held request is therefore routed at the first snapshot that makes room for it.
- A request is held when admission says ``queue`` (in the pool it names) or when no allowed DC
  has a ready instance of its model (pool ``no_capacity``). Pools are FIFO; a request leaves
  its pool only by being routed, rejected, or ``withdraw``-n (its client gave up).
- ``observe(event)`` forwards first tokens, completions and (to stages that want them) KV events
  to every stage.

Each offer returns one ``Outcome`` per request that was settled (admitted and placed, or
rejected), plus one for a request held for the first time; a request that stays held on a
re-offer yields nothing new, so callers report each hold once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.policy.stages import AdmissionStage, DcSelectionStage, InstanceSelectionStage
from agents.policy.types import BlocksChanged, ClusterView, DcChoice, Observation, Outcome, RequestView

NO_CAPACITY_POOL = "no_capacity"


@dataclass(slots=True)
class _Held:
    request: RequestView
    pool: str
    reason: str


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A request admission let through, with the DC selection's candidates for it."""

    request: RequestView
    choice: DcChoice
    reason: str  # admission's


class Scheduler:
    """Admission, DC selection and instance selection, composed; see the module docstring."""

    def __init__(
        self,
        name: str,
        admission: AdmissionStage,
        dc_selection: DcSelectionStage,
        instance_selection: InstanceSelectionStage,
    ) -> None:
        self.name = name
        self.admission = admission
        self.dc_selection = dc_selection
        self.instance_selection = instance_selection
        self._stages = (admission, dc_selection, instance_selection)
        self._kv_stages = tuple(s for s in self._stages if s.wants_kv_events)
        self._held: dict[tuple[str, int], _Held] = {}  # insertion order = FIFO across pools
        self._offered_version = -1

    @property
    def wants_kv_events(self) -> bool:
        return bool(self._kv_stages)

    # --- offers -------------------------------------------------------------------------------

    def submit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Outcome]:
        """Decide new arrivals on ``view`` (see the module docstring for what is returned)."""
        return self._offer(list(requests), view, now_s)

    def tick(self, view: ClusterView, now_s: float) -> list[Outcome]:
        """Offer the held requests again if ``view`` is a snapshot they have not been offered on."""
        if not self._held or view.version == self._offered_version:
            return []
        held = [h.request for h in self._held.values()]
        return self._offer(held, view, now_s)

    def withdraw(self, request_id: str, attempt: int) -> bool:
        """Drop a held request (its client gave up); False if it was not held."""
        return self._held.pop((request_id, attempt), None) is not None

    def held(self) -> dict[str, int]:
        """Requests held, per queue pool."""
        counts: dict[str, int] = {}
        for entry in self._held.values():
            counts[entry.pool] = counts.get(entry.pool, 0) + 1
        return counts

    @property
    def held_total(self) -> int:
        return len(self._held)

    def observe(self, event: Observation) -> None:
        stages = self._kv_stages if isinstance(event, BlocksChanged) else self._stages
        for stage in stages:
            stage.observe(event)

    # --- the pipeline ---------------------------------------------------------------------------

    def _offer(self, requests: list[RequestView], view: ClusterView, now_s: float) -> list[Outcome]:
        self._offered_version = view.version
        outcomes, admitted = self._admit(requests, view, now_s)
        if admitted:
            outcomes += self._place(admitted, view, now_s)
        return outcomes

    def _admit(
        self, requests: list[RequestView], view: ClusterView, now_s: float
    ) -> tuple[list[Outcome], list[_Admitted]]:
        """Admission, then DC selection: outcomes of the requests rejected or newly held, and the
        requests to place with their candidates."""
        outcomes: list[Outcome] = []
        admitted: list[_Admitted] = []
        for request, answer in zip(requests, self.admission.admit(requests, view, now_s), strict=True):
            if answer.action == "reject":
                self._held.pop(request.key, None)
                outcomes.append(
                    Outcome(
                        request,
                        "reject",
                        answer.reason,
                        answer.reason,
                        predicted_ttft_s=answer.predicted_ttft_s,
                    )
                )
            elif answer.action == "queue":
                outcomes += self._hold(request, answer.pool or "default", answer.reason)
            else:
                choice = self.dc_selection.select(request, view, now_s)
                if choice.candidates.any():
                    admitted.append(_Admitted(request, choice, answer.reason))
                else:
                    outcomes += self._hold(request, NO_CAPACITY_POOL, choice.reason)
        return outcomes, admitted

    def _place(self, admitted: list[_Admitted], view: ClusterView, now_s: float) -> list[Outcome]:
        """Instance selection for the admitted requests, as one batch."""
        requests = [a.request for a in admitted]
        placements = self.instance_selection.place(
            requests, [a.choice.candidates for a in admitted], view, now_s
        )
        outcomes = []
        for entry, placement in zip(admitted, placements, strict=True):
            self._held.pop(entry.request.key, None)
            row = placement.instance
            outcomes.append(
                Outcome(
                    entry.request,
                    "admit",
                    placement.reason,
                    entry.reason,
                    dc=entry.choice.dc or str(view.dc[row]),
                    instance=row,
                    instance_id=view.instance_ids[row],
                    predicted_ttft_s=placement.predicted_ttft_s,
                )
            )
        return outcomes

    def _hold(self, request: RequestView, pool: str, reason: str) -> list[Outcome]:
        """Keep ``request`` in ``pool``; an outcome only the first time it is held."""
        was_held = request.key in self._held
        self._held[request.key] = _Held(request, pool, reason)
        return [] if was_held else [Outcome(request, "queue", reason, reason, pool=pool)]
