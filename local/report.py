"""What ``tokenfleet up`` and ``status`` print: the parts and their addresses, and how to call the
gateway with the official ``openai`` client."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infra.settings import Settings
from local.state import StackState


def console() -> Console:
    """Wide when not a terminal (a pipe, a log): addresses and paths are never wrapped there."""
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False, soft_wrap=True)


def table(state: StackState, now: dict[str, str] | None = None) -> Table:
    """One row per part (state, restarts, pid, address, log), then the broker and store if not
    parts. Restarts are the part's own (started again by the stack's supervisor) and, for the
    worker, its decider's (started again by the worker's supervisor): ``1``, ``decider 2``,
    ``1 + decider 2``."""
    directory = Path(state.dir)
    policy = f", policy {state.policy}" if state.policy else ""
    grid = Table(title=f"tokenfleet stack in {directory} (engines: {state.mode}{policy}, {state.phase})")
    for column in ("part", "state", "restarts", "pid", "address", "log"):
        grid.add_column(column, overflow="fold")
    for part in state.parts:
        shown = (now or {}).get(part.name, part.state)
        counts = [str(part.restarts)] if part.restarts or not part.child_restarts else []
        counts += [f"decider {part.child_restarts}"] if part.child_restarts else []
        restarts = "" if part.kind == "engine" else " + ".join(counts)
        log = Path(part.log).name if part.log and Path(part.log).parent == directory else part.log
        pid = "" if part.pid is None or part.kind == "engine" else str(part.pid)
        grid.add_row(*(Text(cell) for cell in (part.name, shown, restarts, pid, part.address, log)))
    if not any(part.kind == "broker" for part in state.parts):
        grid.add_row(*(Text(c) for c in ("broker", "configured", "", "", state.bootstrap, "")))
    grid.add_row(*(Text(c) for c in ("clickhouse", "the worker's", "", "", state.clickhouse, "")))
    return grid


def api_key(state: StackState) -> str:
    """The local API key (read from its file), or "" if there is none."""
    try:
        return Path(state.api_key_file).read_text().strip() if state.api_key_file else ""
    except OSError:
        return ""


def snippet(state: StackState) -> str:
    """Python that calls the gateway with the official client."""
    return (
        "from openai import OpenAI  # pip install openai\n"
        "\n"
        f'client = OpenAI(base_url="{state.gateway_url}", api_key="{api_key(state)}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{state.model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32\n'
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )


def show(state: StackState, now: dict[str, str] | None = None) -> None:
    """The table and, while the stack runs, the key and the snippet, on stdout."""
    out = console()
    out.print(table(state, now))
    sys.stdout.flush()
    if state.phase != "ready" or (now is not None and not any(v == "ready" for v in now.values())):
        return
    key = api_key(state)
    if key:
        print(f"\nAPI key (tenant local, every SLO class; kept in {state.api_key_file}):\n{key}")
    print("\n" + snippet(state), end="")
    print(f"\nstop it: tokenfleet down --dir {state.dir}", flush=True)


def store_shown(settings: Settings) -> str:
    """The worker's store as the table shows it (a server URL without its password)."""
    if not settings.clickhouse_dsn:
        return f"embedded: {(settings.data_dir / 'clickhouse').resolve()}"
    parts = urlsplit(settings.clickhouse_dsn)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return settings.clickhouse_dsn
