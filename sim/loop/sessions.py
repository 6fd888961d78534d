"""Closed-loop sessions: users who wait for each answer before they send the next call.

A workload request may name its ``session_id`` (the user or session that sent it) and a
``think_s``. Within a session, in arrival order, a request with ``think_s`` is *closed-loop*: it
is sent ``think_s`` after its client received the end of the session's previous request (that
request's last attempt ended, plus the trip back; a rejection or a failure ends it too), not at
its own recorded time. Any other request (no session, no ``think_s``, or its session's first) is
sent at its recorded time. So a policy that answers sooner gets the session's next call sooner,
as the recorded users did (``tokenfleet replay export`` writes ``think_s`` where the recorded
call came after its predecessor's end; calls that overlapped stay open-loop).

A closed-loop session lasts as long as it did in the recording: it sends while a call's time is
within ``until`` = its last recorded call's time plus half its mean recorded interval between
calls. Calls it would send later are dropped (a slower policy gets fewer), and a session whose
recorded calls run out earlier keeps calling (a faster policy gets more): each further call
repeats its last recorded call (prompt, its block hashes, output, class), as ``REQUEST~k``, with
the same think time. What a user would have asked in a call that never happened is unknown; the
repeat keeps its shape and its prefix.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field, replace

from sim.workloads.trace import TraceRequest


@dataclass(slots=True)
class _Session:
    until_s: float
    last: TraceRequest  # its last recorded call, the one a further call repeats
    tail: str  # the call whose end sends the next repeat (the last recorded, then each repeat)
    copies: int = 0


@dataclass(slots=True)
class Sessions:
    """The workload's requests, split into those sent at their own time (``first``) and the
    closed-loop ones ``held`` until their predecessor ends (module docstring)."""

    first: list[TraceRequest] = field(default_factory=list)
    held: int = 0  # recorded requests not yet sent or dropped
    _next: dict[str, TraceRequest] = field(default_factory=dict)  # request id -> the one after it
    _session: dict[str, _Session] = field(default_factory=dict)

    @classmethod
    def of(cls, requests: tuple[TraceRequest, ...]) -> Sessions:
        sessions = cls()
        by_session: dict[str, list[TraceRequest]] = defaultdict(list)
        for request in requests:
            if request.session_id:
                by_session[request.session_id].append(request)
            else:
                sessions.first.append(request)
        for name, calls in by_session.items():
            calls.sort(key=lambda r: r.arrival_s)
            sessions.first.append(calls[0])
            for before, after in itertools.pairwise(calls):
                if after.think_s is None:
                    sessions.first.append(after)
                else:
                    sessions._next[before.request_id] = after
                    sessions.held += 1
            if any(r.think_s is not None for r in calls[1:]):
                gap = (calls[-1].arrival_s - calls[0].arrival_s) / (len(calls) - 1)
                last = calls[-1]
                sessions._session[name] = _Session(last.arrival_s + gap / 2, last, last.request_id)
        sessions.first.sort(key=lambda r: r.arrival_s)
        return sessions

    def ended(self, request: TraceRequest, client_end_s: float) -> tuple[TraceRequest, float] | None:
        """``request``'s client received its end at ``client_end_s``: the session's next call
        and when it is sent, None if there is none (the rest of a session past its ``until``
        is dropped)."""
        session = self._session.get(request.session_id)
        if session is None:
            return None
        after = self._next.pop(request.request_id, None)
        if after is not None:
            self.held -= 1
        elif request.request_id == session.tail:
            after = self._repeat(session)
        else:
            return None  # an open-loop call of the session: no call waits on it
        sent_s = client_end_s + (after.think_s or 0.0)
        if sent_s > session.until_s:
            self._drop_after(after)
            return None
        return replace(after, arrival_s=sent_s), sent_s

    def _repeat(self, session: _Session) -> TraceRequest:
        session.copies += 1
        session.tail = f"{session.last.request_id}~{session.copies}"
        return replace(session.last, request_id=session.tail)

    def _drop_after(self, request: TraceRequest) -> None:
        """The session stops: ``request`` and every call chained after it are not sent."""
        nxt = self._next.pop(request.request_id, None)
        while nxt is not None:
            self.held -= 1
            nxt = self._next.pop(nxt.request_id, None)
