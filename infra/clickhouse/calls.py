"""Reads run on the thread that owns the ClickHouse client, between the feedback writes.

The embedded engine and the sink want one thread per client, and the worker's event loop must
never wait on the store; so a read (SLOMax's control loop, a few per minute) is a ``call(client)``
queued here and run by the store thread, which hands ``done(result, error)`` the outcome.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from clickhouse_connect.driver.client import Client

MAX_CALLS = 16
"""Most calls waiting for the store thread."""

Call = Callable[[Client], Any]
Done = Callable[[Any, BaseException | None], None]


class CallQueue:
    """Calls waiting for the store thread. ``lock`` is the store's (one lock for its state)."""

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._calls: deque[tuple[Call, Done]] = deque()

    def __bool__(self) -> bool:
        return bool(self._calls)

    def put(self, call: Call, done: Done) -> bool:
        """(Lock held.) Queue ``call``; False if ``MAX_CALLS`` already wait."""
        if len(self._calls) >= MAX_CALLS:
            return False
        self._calls.append((call, done))
        return True

    def run(self, client: Client) -> None:
        """(Store thread, lock not held.) Run every queued call, oldest first."""
        while True:
            with self._lock:
                if not self._calls:
                    return
                call, done = self._calls.popleft()
            try:
                result = call(client)
            except Exception as exc:
                done(None, exc)
            else:
                done(result, None)
