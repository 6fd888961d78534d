"""Numbered schema migrations: ``migrations/NNNN_verb_object.sql``, applied in order, once.

Each applied migration is recorded in ``schema_migrations`` (version, name, applied_at), so
``migrate`` is idempotent. A file may hold several statements, each ending with ``;`` at the end
of a line. ClickHouse DDL is not transactional: every statement uses ``IF NOT EXISTS`` so a
migration interrupted half-way can simply be applied again. A landed migration is never edited;
change the schema with a new file.

The record alone is not trusted: ``migrate`` also checks that the objects each applied
migration creates (``CREATE TABLE/VIEW ... name``, ``ADD COLUMN ... name``) exist, and applies
again, in version order, every migration with a missing one (a dropped table, a column lost
with it) - safe because of ``IF NOT EXISTS``. An object a later migration drops
(``DROP TABLE``, ``DROP COLUMN``) is not expected to exist.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable

from clickhouse_connect.driver.client import Client

MIGRATIONS_DIR: Traversable = resources.files(__package__) / "migrations"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_NAME = r"`?([A-Za-z_][A-Za-z0-9_]*)`?"
_CREATES = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|(?:MATERIALIZED\s+)?VIEW|DICTIONARY)\s+"
    rf"(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}",
    re.IGNORECASE,
)
_DROPS_TABLE = re.compile(
    rf"^\s*DROP\s+(?:TABLE|VIEW|DICTIONARY)\s+(?:IF\s+EXISTS\s+)?{_NAME}", re.IGNORECASE
)
_ALTERS = re.compile(rf"^\s*ALTER\s+TABLE\s+{_NAME}", re.IGNORECASE)
_ADDS_COLUMN = re.compile(rf"\bADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}", re.IGNORECASE)
_DROPS_COLUMN = re.compile(rf"\bDROP\s+COLUMN\s+(?:IF\s+EXISTS\s+)?{_NAME}", re.IGNORECASE)

VERSION_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    name String,
    applied_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY version
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    def creates(self) -> list[str]:
        """The objects the migration creates: ``table`` names and ``table.column`` names."""
        return _objects(self.statements, _CREATES, _ADDS_COLUMN)

    def drops(self) -> list[str]:
        """The objects the migration drops, named as in ``creates``."""
        return _objects(self.statements, _DROPS_TABLE, _DROPS_COLUMN)


def _objects(statements: Sequence[str], table: re.Pattern[str], column: re.Pattern[str]) -> list[str]:
    found: list[str] = []
    for statement in statements:
        code = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
        if match := table.match(code):
            found.append(match.group(1))
        elif match := _ALTERS.match(code):
            found += [f"{match.group(1)}.{name}" for name in column.findall(code)]
    return found


def load_migrations(directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations in ``directory``, by version. Raises ValueError on a duplicate version."""
    found: dict[int, Migration] = {}
    for entry in directory.iterdir():
        match = _FILE_NAME.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise ValueError(
                f"two migrations with version {version:04d}: {found[version].name}, {entry.name}"
            )
        found[version] = Migration(version, match.group(2), split_statements(entry.read_text("utf-8")))
    return [found[v] for v in sorted(found)]


def split_statements(sql: str) -> tuple[str, ...]:
    """Statements of a migration file (a ``;`` inside a string literal must not end a line)."""
    chunks = (chunk.strip() for chunk in _STATEMENT_END.split(sql))
    return tuple(chunk for chunk in chunks if _has_code(chunk))


def _has_code(chunk: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in chunk.splitlines())


def applied_versions(client: Client) -> set[int]:
    client.command(VERSION_TABLE_DDL)
    return {int(row[0]) for row in client.query("SELECT DISTINCT version FROM schema_migrations").result_rows}


def existing_objects(client: Client) -> set[str]:
    """Tables (and views) of the current database, and their columns as ``table.column``."""
    tables = client.query("SELECT name FROM system.tables WHERE database = currentDatabase()")
    columns = client.query("SELECT table, name FROM system.columns WHERE database = currentDatabase()")
    return {str(row[0]) for row in tables.result_rows} | {f"{t}.{c}" for t, c in columns.result_rows}


def migrate(client: Client, migrations: Sequence[Migration] | None = None) -> list[str]:
    """Apply the pending migrations in version order, and again every applied one whose objects
    are missing; return their labels (``0001_create_x``; a repair reads
    ``0001_create_x (repaired: missing x)``)."""
    done = applied_versions(client)
    applied: list[str] = []
    pending = load_migrations() if migrations is None else sorted(migrations, key=lambda m: m.version)
    dropped_later: list[set[str]] = []
    later: set[str] = set()
    for migration in reversed(pending):
        dropped_later.append(set(later))
        later |= set(migration.drops())
    dropped_later.reverse()
    existing: set[str] | None = None
    for migration, dropped in zip(pending, dropped_later, strict=True):
        if migration.version in done:
            expected = [name for name in migration.creates() if name not in dropped]
            if not expected:
                continue
            existing = existing_objects(client) if existing is None else existing
            missing = [name for name in expected if name not in existing]
            if not missing:
                continue
            for statement in migration.statements:
                client.command(statement)
            existing = None  # re-read after a repair: it may have created more than it missed
            applied.append(f"{migration.label} (repaired: missing {', '.join(missing)})")
            continue
        for statement in migration.statements:
            client.command(statement)
        existing = None
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, datetime.now(UTC)]],
            column_names=["version", "name", "applied_at"],
        )
        applied.append(migration.label)
    return applied
