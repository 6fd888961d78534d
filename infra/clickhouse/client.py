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
or another path, needs the store. ``held_by_another_process`` tells beforehand, without the
engine's own message on stderr.
"""

from __future__ import annotations

import difflib
import fcntl
import re
from pathlib import Path
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


def held_by_another_process(url: str) -> Path | None:
    """The data directory of the embedded store at ``url`` if another process has it open (the
    engine holds an exclusive ``flock`` on ``DIR/status`` while it runs), else None: a server
    URL, an in-memory store, a directory no engine opened yet or one free now. The answer can be
    out of date by the time the store is opened; it is for saying so in one line, not a lock."""
    parts = urlsplit(url)
    if parts.scheme != "chdb" or parts.netloc:
        return None
    directory = Path("/" + parts.path.lstrip("/"))  # chdb:////abs: the path is //abs
    try:
        with (directory / "status").open("rb") as status:
            fcntl.flock(status, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when closed
    except BlockingIOError:
        return directory
    except OSError:  # no status file: nothing runs there
        return None
    return None


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


READ_ONLY_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
# Table functions (and the scalar file()) that read files, URLs, object stores, other servers or
# the client's input: refused in read-only mode even where the engine would run them.
EXTERNAL_FUNCTIONS = (
    "file", "fileCluster", "url", "urlCluster", "s3", "s3Cluster", "gcs", "oss", "cosn", "hdfs",
    "hdfsCluster", "azureBlobStorage", "azureBlobStorageCluster", "remote", "remoteSecure",
    "cluster", "clusterAllReplicas", "input", "mysql", "postgresql", "sqlite", "mongodb", "redis",
    "jdbc", "odbc", "executable", "iceberg", "icebergS3", "icebergAzure", "icebergHDFS",
    "icebergLocal", "deltaLake", "deltaLakeLocal", "hudi", "paimon", "ytsaurus", "arrowFlight",
    "python",
)  # fmt: skip
_COMMENT_OR_LITERAL = re.compile(
    r"--[^\n]*|#[^\n]*|/\*.*?\*/|'(?:[^'\\]|\\.|'')*'|\"((?:[^\"\\]|\\.)*)\"|`((?:[^`\\]|\\.)*)`",
    re.DOTALL,
)
_EXTERNAL_CALL = re.compile(r"\b(" + "|".join(EXTERNAL_FUNCTIONS) + r")\s*\(", re.IGNORECASE)
_INTO_OUTFILE = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)
WRITE_STATEMENTS = (
    "INSERT", "ALTER", "CREATE", "DROP", "TRUNCATE", "DELETE", "UPDATE", "OPTIMIZE", "RENAME",
    "EXCHANGE", "ATTACH", "DETACH", "SYSTEM", "GRANT", "REVOKE", "KILL", "SET", "USE", "UNDROP",
)  # fmt: skip
"""The statements that change the store (``--write``); any other word is not a statement."""


def check_read_only(sql: str) -> None:
    """``ValueError`` unless ``sql`` is one statement that only reads the store: SELECT, WITH,
    SHOW, DESCRIBE, EXPLAIN or EXISTS, without ``INTO OUTFILE`` and without a function that
    reads files, URLs or other servers (``file(``, ``url(``, ``s3(``, ``remote(``, ``input(``...).

    A check of the text, on top of ``readonly=1`` (which the embedded engine enforces for
    writes but not for ``INTO OUTFILE``): string literals and comments are ignored, quoted
    identifiers count as names."""

    def blank(match: re.Match[str]) -> str:
        quoted = match.group(1) if match.group(1) is not None else match.group(2)
        if quoted is not None:
            return f" {quoted} "  # "file"(...) still calls file
        return " '' " if match.group(0).startswith("'") else " "

    code = _COMMENT_OR_LITERAL.sub(blank, sql).strip().rstrip(";").strip()
    if not code:
        raise ValueError("empty query")
    if ";" in code:
        raise ValueError("one statement at a time (found ';' inside the query)")
    keyword = re.split(r"[\s(]+", code.lstrip("("), maxsplit=1)[0].upper()
    if keyword not in READ_ONLY_STATEMENTS:
        if keyword not in WRITE_STATEMENTS:
            close = difflib.get_close_matches(keyword, (*READ_ONLY_STATEMENTS, *WRITE_STATEMENTS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{keyword or 'this'!r} does not start a ClickHouse statement{hint}")
        raise ValueError(
            f"{keyword} statements are refused: the query is read-only "
            f"({', '.join(READ_ONLY_STATEMENTS)}); pass --write to change the store"
        )
    if _INTO_OUTFILE.search(code):
        raise ValueError("INTO OUTFILE is refused: the query is read-only; pass --write to allow it")
    external = _EXTERNAL_CALL.search(code)
    if external:
        raise ValueError(
            f"{external.group(1)}() is refused: a read-only query reads the store only, not files, "
            "URLs or other servers; pass --write to allow it"
        )


def query_settings(max_rows: int, timeout_s: float, write: bool = False) -> dict[str, int | float | str]:
    """ClickHouse settings of a user's query: at most ``max_rows`` result rows (an error beyond),
    ``timeout_s`` of execution, and ``readonly=1`` unless ``write``. ``readonly`` comes last: the
    embedded engine applies some settings one by one, and none may change once it is set."""
    settings: dict[str, int | float | str] = {
        "max_result_rows": max_rows,
        "result_overflow_mode": "throw",
        "max_execution_time": timeout_s,
    }
    if not write:
        settings["readonly"] = 1
    return settings
