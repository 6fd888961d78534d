"""Request ids: the client's ``x-request-id`` where it can be one, a fresh id where not.

The request id names a call everywhere: on the bus (``tf.requests``, the decisions, the
completions), in the gateway's log, in the answer's ``id`` (``chatcmpl-<id>`` / ``cmpl-<id>``, as
vLLM names it) and in the ``x-request-id`` response header. A client (or the proxy before the
gateway) may choose it by sending ``x-request-id``: 1 to 128 visible ASCII characters (no spaces
or controls). This gateway remembers its last ``remembered`` ids and how each call ended:

- an id it has not seen: the call takes it, at attempt 1;
- an id whose call ended without its answer (an error, a reject, a 503, a client that left):
  the **same call, tried again** (a client retrying, as the ``openai`` client does after a 503):
  it keeps the id and goes on the bus as the next attempt (``first_attempt``), so the scheduler,
  which decides once per (request id, attempt), decides it anew and nothing is answered twice;
- an id whose call is still running: ``InFlight`` (the gateway answers 409 with
  ``Retry-After``: the first call ends, then the retry is the next attempt);
- an id whose call was answered: a new call that reused an id; it gets an id of the gateway's
  own, and the client's is kept beside it, for the log.

An invalid id is replaced by the gateway's own the same way. Ids a client chooses are trusted to
be unique across gateway replicas and restarts (a UUID is); one gateway only remembers its own.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_CLIENT_ID_LENGTH = 128
HEADER = "x-request-id"


@dataclass(frozen=True)
class RequestId:
    """A call's id, and the client's ``x-request-id`` when it sent one (used or not);
    ``first_attempt``: the attempt the call starts at (above 1: an earlier call with this id
    ended without its answer)."""

    id: str
    client_id: str | None = None
    why_not: str = ""  # why the client's was not used ("" when it was, or none came)
    first_attempt: int = 1

    def response_id(self, kind: str) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.id}"


class InFlight(Exception):
    """A call with this ``x-request-id`` is still running here."""


@dataclass
class _Seen:
    last_attempt: int = 0  # the highest attempt a call with this id used (0: none reached the bus)
    running: bool = True
    answered: bool = False


def valid_client_id(value: str) -> bool:
    return 0 < len(value) <= MAX_CLIENT_ID_LENGTH and all("!" <= c <= "~" for c in value)


class RequestIds:
    def __init__(self, remembered: int = 100_000) -> None:
        self.remembered = remembered
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._count = 0
        self._prefix = f"gw-{os.getpid()}-{int(time.time() * 1000) % 10**9}"

    def assign(self, client_id: str | None) -> RequestId:
        """The id of a new call that came with ``client_id`` (its ``x-request-id``, or None);
        ``InFlight`` if a call with that id is still running. Every id assigned must be
        ``ended``."""
        why_not = ""
        if client_id is not None:
            seen = self._seen.get(client_id)
            if not valid_client_id(client_id):
                why_not = f"not 1 to {MAX_CLIENT_ID_LENGTH} visible ASCII characters"
            elif seen is None:
                self._remember(client_id, _Seen())
                return RequestId(client_id, client_id)
            elif seen.running:
                raise InFlight(client_id)
            elif not seen.answered:
                seen.running = True
                self._seen.move_to_end(client_id)
                return RequestId(client_id, client_id, first_attempt=seen.last_attempt + 1)
            else:
                why_not = "already answered"
        while True:
            self._count += 1
            own = f"{self._prefix}-{self._count}"
            if own not in self._seen:  # a client may have sent one of ours before
                self._remember(own, _Seen())
                return RequestId(own, client_id, why_not)

    def ended(self, rid: RequestId, answered: bool, last_attempt: int) -> None:
        """The call ``rid`` ended: answered (the client got its whole answer) or not;
        ``last_attempt``: the highest attempt it put on the bus."""
        seen = self._seen.get(rid.id)
        if seen is not None:
            seen.running, seen.answered = False, answered
            seen.last_attempt = max(seen.last_attempt, last_attempt)

    def _remember(self, request_id: str, seen: _Seen) -> None:
        self._seen[request_id] = seen
        if len(self._seen) > self.remembered:
            self._seen.popitem(last=False)
