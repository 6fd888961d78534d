"""The engine port over the simulator's engine model: ``sim.loop.live.LiveFleet`` in scaled wall time.

Nothing here waits: every call runs the emulated instances up to its ``now_wall`` and returns.
The emulated clients give up as ``LiveFleet`` says (``timeout`` completions); durations in
events are emulated seconds (see ``sim.loop.live``).
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.engines.port import Endpoint, EngineError, EngineEvent
from schemas.events import Completion, Heartbeat, Response, RoutingDecision
from sim.engine.fleet import parse_fleet
from sim.loop.live import LiveFleet


class EmulatedEngines:
    """``EnginePort`` over a ``LiveFleet`` (its instances run ``speed`` times faster than the
    clock, emulated time 0 at its ``start_wall``)."""

    def __init__(self, fleet: LiveFleet) -> None:
        self._fleet = fleet
        self._endpoints = tuple(
            Endpoint(spec.instance_id, spec.dc, spec.model, spec.version, spec.profile.name)
            for spec in fleet.fleet.instances
        )
        self._closed = False

    @classmethod
    def from_spec(
        cls,
        spec: str,
        speed: float = 1.0,
        start_wall: float | None = None,
        output_tokens: Mapping[str, int] | None = None,
    ) -> EmulatedEngines:
        """From a fleet spec (``sim.engine.fleet.parse_fleet``; ``ValueError`` if invalid);
        ``output_tokens``: the answers' lengths by request id (``LiveFleet``)."""
        return cls(LiveFleet(parse_fleet(spec), speed, start_wall, output_tokens=output_tokens))

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    @property
    def open_requests(self) -> int:
        return self._fleet.open_attempts

    async def dispatch(self, decision: RoutingDecision, now_wall: float) -> bool:
        return self._live().submit(decision, now_wall)

    async def abort(self, request_id: str, attempt: int, now_wall: float) -> bool:
        return self._live().abort(request_id, attempt, now_wall)

    async def load(self, now_wall: float) -> list[Heartbeat]:
        return self._live().heartbeats(now_wall)

    async def events(self, now_wall: float) -> list[EngineEvent]:
        """The emulated instances' events, each ``Completion`` preceded by its ``Response`` (no
        text: the emulation generates token counts, not tokens)."""
        out: list[EngineEvent] = []
        for event in self._live().advance(now_wall):
            if isinstance(event, Completion):
                out.append(
                    Response(
                        ts=event.ts,
                        request_id=event.request_id,
                        attempt=event.attempt,
                        instance_id=event.instance_id,
                        model=event.model,
                        status=event.status,
                        prompt_tokens=event.input_tokens,
                        completion_tokens=event.output_tokens,
                        cached_tokens=event.cached_tokens,
                        error="" if event.status == "ok" else event.status,
                    )
                )
            out.append(event)
        return out

    def next_wakeup(self, now_wall: float) -> float | None:
        return self._live().next_wakeup(now_wall)

    async def close(self) -> None:
        # Nothing to release: the emulated attempts still open just stop existing.
        self._closed = True

    def _live(self) -> LiveFleet:
        if self._closed:
            raise EngineError("the emulated engines are closed")
        return self._fleet
