"""Store-outage injection for the fault suite's ``store_down_mid_run`` (``bench/faults.py``).

Python imports this module at start-up (as ``sitecustomize``) only in the worker processes the
suite starts with this directory on ``PYTHONPATH`` and ``TOKENFLEET_FAULT_STORE_DOWN_FILE`` set;
nothing else loads it. While that file exists, every call the worker makes to ClickHouse —
connecting, and each ``command`` / ``query`` / ``insert`` of an open client — raises
clickhouse-connect's ``OperationalError``, the error a client gets from a server that went away.

Why at the client edge: the embedded engine (chdb) runs inside the worker, so it cannot be
stopped apart from it, and no ClickHouse server exists on these machines. The engine behind the
edge is the real one and stores everything that gets through; what is injected is exactly what
the worker would see of an outage.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

_METHODS = ("command", "query", "insert", "raw_query", "raw_insert", "query_arrow", "query_df", "query_np")


def _install(flag: str) -> None:
    from clickhouse_connect.driver.exceptions import OperationalError

    import infra.clickhouse.client as clickhouse

    real_connect = clickhouse.connect

    def check() -> None:
        if os.path.exists(flag):
            raise OperationalError("store outage (injected by the fault suite): connection refused")

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            check()
            return method(*args, **kwargs)

        return call

    def connect(url: str) -> Any:
        check()
        client = real_connect(url)
        for name in _METHODS:
            if hasattr(client, name):
                setattr(client, name, guarded(getattr(client, name)))
        return client

    clickhouse.connect = connect  # before infra.clickhouse.feedback imports it by name


if _flag := os.environ.get("TOKENFLEET_FAULT_STORE_DOWN_FILE"):
    _install(_flag)
