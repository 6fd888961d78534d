"""Numbered schema migrations: ``migrations/NNNN_verb_object.sql``, applied in order, once.

Each applied migration is recorded in ``schema_migrations`` (version, name, applied_at), so
``migrate`` is idempotent. A file may hold several statements, each ending with ``;`` at the end
of a line. ClickHouse DDL is not transactional: every statement uses ``IF NOT EXISTS`` so a
migration interrupted half-way can simply be applied again. A landed migration is never edited;
change the schema with a new file.
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


def migrate(client: Client, migrations: Sequence[Migration] | None = None) -> list[str]:
    """Apply the pending migrations in version order; return their labels (``0001_create_x``)."""
    done = applied_versions(client)
    applied: list[str] = []
    pending = load_migrations() if migrations is None else sorted(migrations, key=lambda m: m.version)
    for migration in pending:
        if migration.version in done:
            continue
        for statement in migration.statements:
            client.command(statement)
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, datetime.now(UTC)]],
            column_names=["version", "name", "applied_at"],
        )
        applied.append(migration.label)
    return applied
