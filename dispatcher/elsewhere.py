"""Requests a gateway runs on this dispatcher's engines, counted in their load.

A heartbeat's ``tokens_in_flight`` is the count over every request sent to an instance and not
ended (``schemas.events.Heartbeat``): vLLM does not export it, so the dispatcher counts it. The
requests it runs itself it counts from their stream (prompt plus tokens streamed so far, in the
engine adapter). A request a gateway accepted (``reply="http"``) is run by that gateway, not
here; ``RunElsewhere`` counts those too, from what the log says of them:

- from its routing decision on ``tf.decisions`` (which the dispatcher reads anyway, and skips
  for running): its prompt tokens join its instance's count;
- to its ``Completion`` on ``tf.completions`` (the gateway publishes one for every call it ran,
  whatever its end): it leaves the count.

The difference from an own request: its output is not seen until it ends (the gateway streams
it to its caller, not to the log), so it counts as its prompt alone while it runs. A request
whose completion never comes (its gateway died mid-call) leaves the count at its deadline, or
``forget_after_s`` after its decision without one; the dispatcher reads the completions of the
last ``forget_after_s`` when it starts, so a call that ended before then is not counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.events import MAX_COUNT, Completion, Heartbeat, RoutingDecision

FORGET_AFTER_S = 600.0  # a gateway call without a deadline is given up on after this (its timeout)
REMEMBERED_ENDS = 10_000


@dataclass(frozen=True, slots=True)
class _Running:
    instance_id: str
    tokens: int
    until: float  # wall time after which it is forgotten without a completion


class RunElsewhere:
    """The gateway-run requests of these engines, by (request id, attempt) (module docstring)."""

    def __init__(self, forget_after_s: float = FORGET_AFTER_S) -> None:
        self.forget_after_s = forget_after_s
        self._running: dict[tuple[str, int], _Running] = {}
        # The last ends read: a completion may be read before its decision (another consumer,
        # another partition); that decision is then not counted.
        self._ended: OrderedDict[tuple[str, int], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._running)

    def started(self, decision: RoutingDecision, now: float) -> None:
        """A decision about a request a gateway runs (read again after a restart: counted once)."""
        key = (decision.request_id, decision.attempt)
        if key in self._ended:
            return
        # Forgotten counting from when it was decided, not from when it was read: a dispatcher
        # that joins reads the decisions of earlier runs, whose completions it never sees.
        until = min(decision.ts, now) + self.forget_after_s
        deadline = decision.request.deadline_ts
        if deadline is not None:
            until = min(deadline, until)
        if until >= now:
            self._running[key] = _Running(decision.instance_id, decision.request.input_tokens, until)

    def ended(self, completion: Completion) -> None:
        key = (completion.request_id, completion.attempt)
        self._running.pop(key, None)
        self._ended[key] = None
        if len(self._ended) > REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    def tokens(self, now: float) -> dict[str, int]:
        """Tokens in flight per instance from gateway-run requests (the forgotten ones dropped)."""
        for key in [k for k, r in self._running.items() if r.until < now]:
            del self._running[key]
        counts: dict[str, int] = {}
        for running in self._running.values():
            counts[running.instance_id] = counts.get(running.instance_id, 0) + running.tokens
        return counts

    def add_to(self, beats: Sequence[Heartbeat], now: float) -> list[Heartbeat]:
        """``beats`` with the gateway-run requests' tokens added to ``tokens_in_flight``."""
        extra = self.tokens(now)
        if not extra:
            return list(beats)
        return [
            beat.model_copy(
                update={"tokens_in_flight": min(beat.tokens_in_flight + extra[beat.instance_id], MAX_COUNT)}
            )
            if beat.instance_id in extra
            else beat
            for beat in beats
        ]
