"""The docs show only commands that exist: README.md and docs/**/*.md, checked on their text.

Every command line in a fenced shell block or an inline code span is checked by what it starts:
- ``make TARGET``: the target is in the Makefile;
- ``tokenfleet COMMAND [SUBCOMMAND] ... --flag``: the command (or the group's subcommand) exists
  in ``cli.main:app`` and takes every ``--flag`` shown;
- ``python -m MODULE ... --flag``: a project module that can be found, and each flag is a string
  in its source (the argparse definitions). Other modules (vLLM's) run in their own environment.

Plus: every ``TOKENFLEET_*`` variable named is a setting (or read somewhere in the code), every
relative link and image points to a file that exists, the figures copied under ``docs/`` are
the ones in ``sim/evaluation/figures/``, the generated settings table lists every setting, and
the README stays short (at most 200 lines).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.unit.test_layers import PROJECT as LAYERED

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROJECT = tuple(p for p in LAYERED if p != "tests")  # the packages a command can name
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SEPARATORS = {"&&", "||", ";", "|", "&"}


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_commands(text: str) -> Iterator[str]:
    """Logical command lines of the shell blocks: comments dropped, continuations joined, a
    quoted argument that spans lines kept whole, split at ``&&``, ``;``, ``|`` and ``&``."""
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL_BLOCKS:
            continue
        pending = ""
        for line in match.group(2).splitlines():
            line = pending + line
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1] + " "
                continue
            try:
                tokens = shlex.split(line.removeprefix("$ "), comments=True)
            except ValueError:  # an open quote: the argument goes on on the next line
                pending = line + "\n"
                continue
            pending = ""
            yield from split_commands(tokens)


def inline_commands(text: str) -> Iterator[str]:
    """Code spans outside fenced blocks that read as a command, whitespace collapsed."""
    for span in INLINE.findall(FENCE.sub("", text)):
        words = " ".join(span.split())
        try:
            tokens = shlex.split(words)
        except ValueError:
            tokens = words.split()
        yield from split_commands(tokens)


def split_commands(tokens: list[str]) -> Iterator[str]:
    command: list[str] = []
    for token in [*tokens, ";"]:
        if token in SEPARATORS:
            if command:
                yield shlex.join(command)
            command = []
        else:
            command.append(token)


def commands() -> list[tuple[str, str]]:
    """(page, command) for every command a page shows that starts with make, tokenfleet or python."""
    found = []
    for path in PAGES:
        text = path.read_text()
        for command in [*fenced_commands(text), *inline_commands(text)]:
            words = shlex.split(command)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words and re.fullmatch(r"(\S*/bin/)?(make|tokenfleet|python3?)", words[0]):
                found.append((page_id(path), shlex.join(words)))
    return sorted(set(found))


def flags(words: list[str]) -> set[str]:
    """The long options a command line uses: ``[--seed N]`` and ``--json=OUT`` give --seed, --json."""
    found = set()
    for word in words:
        word = word.strip("[](),")
        if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", word):
            found.add(word.split("=")[0])
    return found


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", text, re.M))


@cache
def cli() -> Any:
    from cli.main import app

    return typer.main.get_command(app)


def check_make(words: list[str]) -> list[str]:
    targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return [f"no make target {t!r}" for t in targets if t not in make_targets()]


def check_tokenfleet(words: list[str]) -> list[str]:
    names = []  # the command path: the words before the first option (a group may take options)
    for word in words[1:]:
        if word.startswith("-"):
            break
        if not word.startswith("["):
            names.append(word)
    command, path = cli(), ["tokenfleet"]
    for name in names:
        if not hasattr(command, "commands"):
            break
        if name not in command.commands:
            return [f"{' '.join(path)} has no command {name!r} (it has {sorted(command.commands)})"]
        command, path = command.commands[name], [*path, name]
    if hasattr(command, "commands") and not flags(words):
        return []  # a group named alone
    options = {opt for param in command.params for opt in param.opts} | {"--help"}
    return [f"{' '.join(path)} has no option {flag}" for flag in sorted(flags(words) - options)]


def check_python(words: list[str]) -> list[str]:
    if len(words) < 3 or words[1] != "-m":
        return []
    module = words[2]
    if module.split(".")[0] not in PROJECT:
        return []  # pytest, ruff, mypy, vLLM: tools, or what runs in the engine's environment
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
        spec = importlib.util.find_spec(module + ".__main__")
    if spec is None or spec.origin is None:
        return [f"no module {module}"]
    source = Path(spec.origin).read_text()
    strings = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    return [f"{module} has no option {flag}" for flag in sorted(flags(words[3:]) - strings)]


def test_the_pages_show_commands() -> None:
    shown = commands()
    for start in ("make", "tokenfleet", "python"):
        assert any(command.startswith(start) for _, command in shown), start


@pytest.mark.parametrize(("page", "command"), commands())
def test_every_command_shown_exists(page: str, command: str) -> None:
    words = shlex.split(command)
    program = Path(words[0]).name
    checks = {"make": check_make, "tokenfleet": check_tokenfleet}
    problems = checks.get(program, check_python)(words)
    assert problems == [], f"{page}: {command}"


def test_every_setting_named_exists() -> None:
    from infra.settings import Settings

    settings = {f"TOKENFLEET_{name.upper()}" for name in Settings.model_fields}
    code = "\n".join(path.read_text() for package in PROJECT for path in (ROOT / package).rglob("*.py"))
    unknown = set()
    for path in PAGES:
        text = path.read_text()
        for match in re.finditer(r"TOKENFLEET_[A-Z0-9_]*", text):
            name, prefix = match.group(0), text[match.end() : match.end() + 1] == "*"
            if prefix:
                if not any(s.startswith(name) for s in settings):
                    unknown.add((page_id(path), name + "*"))
                continue
            name = name.split("__")[0].rstrip("_")
            if name not in settings and not re.search(rf"\b{name}\b", code):
                unknown.add((page_id(path), name))
    assert sorted(unknown) == []


def test_every_relative_link_points_to_a_file() -> None:
    broken = []
    for path in PAGES:
        for target in LINK.findall(FENCE.sub("", path.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append((page_id(path), target))
    assert broken == []


def test_the_figures_under_docs_are_the_simulators() -> None:
    copies = sorted((ROOT / "docs" / "assets" / "figures").glob("*.png"))
    assert copies
    for copy in copies:
        original = ROOT / "sim" / "evaluation" / "figures" / copy.name
        assert original.exists() and original.read_bytes() == copy.read_bytes(), copy.name


def test_the_settings_table_lists_every_setting() -> None:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    from infra.settings import Settings

    table = hooks.on_page_markdown("before\n<!-- settings-table -->\nafter")
    rows = [line for line in table.splitlines() if line.startswith("| `TOKENFLEET_")]
    assert {f"TOKENFLEET_{name.upper()}" for name in Settings.model_fields} <= {
        row.split("`")[1] for row in rows
    }
    assert all(row.count(" | ") == 3 for row in rows)


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
