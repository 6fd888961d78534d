"""The store's commands: ``sql``, ``db migrate``, ``slomax status`` (read from the ClickHouse
store), and ``schemas export`` (the events' contracts the store and the broker carry)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.options import MAX_TOKENS, first_line, load_settings, real, whole

schemas_app = typer.Typer(
    help="event contracts\n\n\b\nExample:\n  tokenfleet schemas export out/schemas", rich_markup_mode=None
)
db_app = typer.Typer(
    help="the ClickHouse store\n\n\b\nExample:\n  tokenfleet db migrate", rich_markup_mode=None
)
slomax_app = typer.Typer(
    help="SLOMax admission control\n\n\b\nExample:\n  tokenfleet slomax status --steps 10",
    rich_markup_mode=None,
)


@schemas_app.command("export")
def schemas_export(directory: Annotated[str, typer.Argument(metavar="DIR")]) -> None:
    """Write JSON Schema files for every event.

    \b
    Example:
      tokenfleet schemas export out/schemas
    """
    from schemas.export import export_json_schemas

    for path in export_json_schemas(Path(directory)):
        print(path)


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending migrations, and re-apply those whose tables or columns are missing.

    \b
    Example:
      tokenfleet db migrate
    """
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.migrate import migrate

    settings = load_settings()
    client = open_store(settings.clickhouse_url)
    try:
        applied = migrate(client)
    except ClickHouseError as exc:
        raise ValueError(f"migration failed: {first_line(exc)}") from None
    finally:
        client.close()
    print("\n".join(applied) if applied else "database is up to date")


@slomax_app.command("status")
def slomax_status(
    steps: Annotated[
        int, typer.Option("--steps", metavar="N", help="control steps to show", callback=whole(1, 1000))
    ] = 5,
) -> None:
    """SLOMax's shares and thresholds in force (the configured policy's), its last control steps
    and the rejects of the last 5 minutes by reason, read from the store.

    \b
    Example:
      tokenfleet slomax status --steps 10
    """
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.migrate import migrate
    from infra.slomax_status import status_lines

    settings = load_settings()
    client = open_store(settings.clickhouse_url)
    try:
        migrate(client)  # a fresh store has the tables (and nothing in them) rather than an error
        print("\n".join(status_lines(client, settings, steps)))
    except ClickHouseError as exc:
        raise ValueError(f"cannot read the store: {first_line(exc)}") from None
    finally:
        client.close()


def sql(
    query: Annotated[str, typer.Argument(metavar="QUERY")],
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="allow statements that change the store (INSERT, ALTER, DROP, ...) and functions "
            "that read files or URLs",
        ),
    ] = False,
    max_rows: Annotated[
        int,
        typer.Option(
            "--max-rows", metavar="N", help="refuse results of more rows", callback=whole(1, MAX_TOKENS)
        ),
    ] = 10_000,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="S",
            help="stop the query after S seconds",
            callback=real(0.0, 3600.0, unit=" s"),
        ),
    ] = 30.0,
) -> None:
    """Run a ClickHouse SQL query on the store (tab-separated output); read-only unless --write:
    one SELECT, WITH, SHOW, DESCRIBE, EXPLAIN or EXISTS statement, run with readonly=1.

    \b
    Example:
      tokenfleet sql "SELECT slo_class, count() FROM completions FINAL GROUP BY slo_class"
    """
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import check_read_only, query_settings

    if not write:
        check_read_only(query)  # before the store is opened
    settings = load_settings()
    client = open_store(settings.clickhouse_url)
    try:
        try:
            result = client.query(query, settings=query_settings(max_rows, timeout, write))
        except ClickHouseError as exc:
            message = first_line(exc)
            if not write and "READONLY" in message:
                message += " (the query is read-only; pass --write to change the store)"
            raise ValueError(message) from None
        print("\t".join(result.column_names))
        for row in result.result_rows:
            print("\t".join("" if v is None else str(v) for v in row))
    finally:
        client.close()


def open_store(url: str) -> Any:
    """A client on the store at ``url``; a store that cannot be opened is one line (exit 2), and so
    is an embedded store another process holds (the worker of a running stack: the engine admits
    one process at a time)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from infra.clickhouse.client import connect, held_by_another_process

    held = held_by_another_process(url)
    if held is not None:
        raise ValueError(
            f"the embedded store {held} is held by a running process (the worker of `tokenfleet up` or "
            "`tokenfleet worker`; one process at a time): query it once that stopped (`tokenfleet down`), "
            "or give the stack a ClickHouse server (TOKENFLEET_CLICKHOUSE_DSN) to query while it runs"
        )
    try:
        return connect(url)
    except ClickHouseError as exc:
        raise ValueError(f"cannot open the store: {first_line(exc)}") from None
