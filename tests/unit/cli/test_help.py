"""Every command's help: ``-h`` as ``--help``, an example that parses, ``--version``; the CLI's
modules stay small."""

from __future__ import annotations

import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer

from cli.main import app, main

ROOT = Path(__file__).resolve().parents[3]


def command_paths() -> list[tuple[str, ...]]:
    """The path of every command and group under the app, the app itself (``()``) first."""
    found: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        found.append(path)
        if hasattr(command, "list_commands"):  # a group (typer's own copy of click, or click)
            for name in command.list_commands(typer.Context(command)):
                sub = command.get_command(typer.Context(command), name)
                assert sub is not None
                walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


PATHS = command_paths()


def test_the_walk_finds_every_command_and_group() -> None:
    assert {" ".join(p) for p in PATHS} >= {
        "", "simulate", "capacity", "tail", "report", "generate", "worker", "fleet", "gateway",
        "loadgen", "sql", "batch", "batch submit", "batch results", "schemas", "schemas export", "db",
        "db migrate", "slomax", "slomax status", "up", "status", "down",
    }  # fmt: skip


def examples(help_text: str) -> list[str]:
    """The command lines under the help's ``Example:`` line (indented, up to a blank line)."""
    lines = help_text.splitlines()
    start = [i for i, line in enumerate(lines) if line.strip() == "Example:"]
    assert start, help_text
    found = []
    for line in lines[start[0] + 1 :]:
        if not line.strip():
            break
        found.append(line.strip())
    return found


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "tokenfleet")
def test_h_is_help_and_shows_an_example(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    assert main([*path, "-h"]) == 0
    short = capsys.readouterr()
    assert main([*path, "--help"]) == 0
    assert capsys.readouterr().out == short.out and short.err == ""
    assert short.out.startswith(f"Usage: {' '.join(('tokenfleet', *path))} ")
    assert "-h, --help" in short.out
    lines = examples(short.out)
    assert lines and all(line.startswith("tokenfleet ") or "tokenfleet " in line for line in lines)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "tokenfleet")
def test_every_example_parses(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    """Each example names real commands and options with valid values (parsed, not run)."""
    assert main([*path, "-h"]) == 0
    for line in examples(capsys.readouterr().out):
        words = shlex.split(line)
        words = words[words.index("tokenfleet") + 1 :]  # after any VAR=value
        command: Any = typer.main.get_command(app)
        ctx = typer.Context(command, info_name="tokenfleet")
        while hasattr(command, "list_commands") and words and not words[0].startswith("-"):
            sub = command.get_command(ctx, words[0])  # a group's subcommand (an option: its own)
            assert sub is not None, line
            command, ctx = sub, typer.Context(sub, info_name=words[0], parent=ctx)
            words = words[1:]
        command.make_context(ctx.info_name, words, parent=ctx.parent)  # raises on a bad option or value


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tokenfleet {version('tokenfleet')}\n"
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "--version"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == f"tokenfleet {version('tokenfleet')}\n"
    assert done.stderr == ""


def test_no_command_and_an_unknown_one_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().err == "tokenfleet: error: Missing command.\n"
    assert main(["nope", "-h"]) == 2
    assert capsys.readouterr().err == "tokenfleet: error: No such command 'nope'.\n"


def test_each_module_of_the_cli_is_under_300_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "cli").glob("*.py")}
    shown = {"main.py", "options.py", "simulator.py", "service.py", "store.py", "traffic.py", "up.py"}
    assert shown <= sizes.keys()
    assert {name: n for name, n in sizes.items() if n >= 300} == {}


@pytest.mark.parametrize("args", [["slomax", "status"], ["db", "migrate"], ["sql", "SELECT 1"]])
def test_an_error_of_a_group_command_names_the_subcommand(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    import infra.clickhouse.client

    def refuse(url: str) -> None:
        raise ValueError("no store here")

    monkeypatch.setattr(infra.clickhouse.client, "connect", refuse)
    assert main(args) == 2
    name = " ".join(args[:2] if args[0] != "sql" else args[:1])
    assert capsys.readouterr().err == f"tokenfleet {name}: error: no store here\n"


def test_an_error_of_a_groups_own_command_names_the_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tokenfleet replay --run RUN`` is the group ``replay`` running its own command."""
    import cli.replay_run

    def refuse(*args: object) -> None:
        raise OSError("no store here")

    monkeypatch.setattr(cli.replay_run, "replay_command", refuse)
    assert main(["replay", "--run", "r1", "--policy", "round-robin"]) == 2
    assert capsys.readouterr().err == "tokenfleet replay: error: no store here\n"
