"""One way to open ClickHouse: the embedded engine (chdb) or a server, by URL.

``chdb:///abs/path`` runs the engine in this process with its data under ``path``;
``http(s)://user:pass@host:8123/db`` talks to a server. Both give the same clickhouse-connect
``Client`` and the same SQL. The database is ``tokenfleet`` unless the URL names another (the
path of an HTTP URL, or ``?database=NAME`` on either); it is created if missing.

The embedded engine locks its data directory: one *process* at a time. A second process gets
``ProgrammingError: Unable to open the chdb engine ... Error initializing EmbeddedServer`` (the
engine prints ``Cannot lock file .../status`` to stderr). Inside one process every client shares
the one engine, and the process can host only one engine path while any client is open. So
close clients (``client.close()`` or ``with connect(url) as client:``) before another process,
or another path, needs the store.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

DEFAULT_DATABASE = "tokenfleet"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def connect(url: str) -> Client:
    """An open client on ``url`` whose current database exists. The caller closes it."""
    dsn, database = split_database(url)
    client = clickhouse_connect.get_client(dsn=dsn)
    try:
        client.command(f"CREATE DATABASE IF NOT EXISTS {database}", use_database=False)
        client.database = database
    except Exception:
        client.close()
        raise
    return client


def split_database(url: str) -> tuple[str, str]:
    """``url`` without its database part, and the database name (validated identifier).

    The database is left out of the DSN on purpose: clickhouse-connect would select it on
    connect, which fails while it does not exist yet.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("chdb", "http", "https"):
        raise ValueError(f"unsupported ClickHouse URL scheme {parts.scheme!r} (chdb, http, https)")
    query = parse_qsl(parts.query)
    database = next((v for k, v in query if k == "database"), "")
    query = [(k, v) for k, v in query if k != "database"]
    path = parts.path
    if parts.scheme != "chdb" or parts.netloc:
        # http://host/db and chdb://memory/db: the path names the database, not a location
        database = database or path.strip("/")
        path = ""
    database = database or DEFAULT_DATABASE
    if not _IDENTIFIER.match(database):
        raise ValueError(f"invalid ClickHouse database name {database!r}")
    if parts.scheme == "chdb" and not parts.netloc:
        # Rebuilt by hand: urlunsplit would turn the path of chdb:////abs into a host name.
        dsn = "chdb:///" + path.lstrip("/") + (f"?{urlencode(query)}" if query else "")
    else:
        dsn = urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))
    return dsn, database
