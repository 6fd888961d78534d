"""Request ids: the client's ``x-request-id`` where it can be one, a fresh id where not.

The request id names a call everywhere: on the bus (``tf.requests``, the decisions, the
completions), in the gateway's log, in the answer's ``id`` (``chatcmpl-<id>`` / ``cmpl-<id>``, as
vLLM names it) and in the ``x-request-id`` response header. A client (or the proxy before the
gateway) may choose it by sending ``x-request-id``: it is taken if it is 1 to 128 visible ASCII
characters (no spaces or controls) and this gateway has not used it among its last
``remembered`` ids. On the bus it must be unique: the scheduler takes a request id it has
already decided as a redelivery and skips it. Otherwise the call gets an id of the gateway's own
and the client's is kept beside it, for the log. Ids a client chooses are trusted to be unique
across gateway replicas and restarts (a UUID is); one gateway only remembers its own.
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
    """A call's id, and the client's ``x-request-id`` when it sent one (used or not)."""

    id: str
    client_id: str | None = None
    why_not: str = ""  # why the client's was not used ("" when it was, or none came)

    def response_id(self, kind: str) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.id}"


def valid_client_id(value: str) -> bool:
    return 0 < len(value) <= MAX_CLIENT_ID_LENGTH and all("!" <= c <= "~" for c in value)


class RequestIds:
    def __init__(self, remembered: int = 100_000) -> None:
        self.remembered = remembered
        self._used: OrderedDict[str, None] = OrderedDict()
        self._count = 0
        self._prefix = f"gw-{os.getpid()}-{int(time.time() * 1000) % 10**9}"

    def assign(self, client_id: str | None) -> RequestId:
        """The id of a new call that came with ``client_id`` (its ``x-request-id``, or None)."""
        why_not = ""
        if client_id is not None:
            if not valid_client_id(client_id):
                why_not = f"not 1 to {MAX_CLIENT_ID_LENGTH} visible ASCII characters"
            elif client_id in self._used:
                why_not = "already used"
            else:
                self._remember(client_id)
                return RequestId(client_id, client_id)
        while True:
            self._count += 1
            own = f"{self._prefix}-{self._count}"
            if own not in self._used:  # a client may have sent one of ours before
                self._remember(own)
                return RequestId(own, client_id, why_not)

    def _remember(self, request_id: str) -> None:
        self._used[request_id] = None
        if len(self._used) > self.remembered:
            self._used.popitem(last=False)
