"""A bad ``TOKENFLEET_CONFIG`` file stops every command with one line naming it, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("policy: tokenpilot\n  bad: [\n", "is not valid YAML (line 2, column 6"),
        ("- policy\n", "must be a mapping"),
        ("polcy: tokenpilot\n", "setting polcy: not a setting"),
    ],
)
@pytest.mark.parametrize("command", [["sql", "select 1"], ["worker"], ["gateway"]])
def test_a_bad_settings_file_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    text: str,
    expected: str,
) -> None:
    path = tmp_path / "tokenfleet.yaml"
    path.write_text(text)
    monkeypatch.setenv("TOKENFLEET_CONFIG", str(path))
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tokenfleet {command[0]}: error: settings file ")
    assert str(path) in err and expected in err


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "tokenfleet.yaml"
    path.write_text("policy: tokenpilot\n  bad: [\n")
    env = {**os.environ, "TOKENFLEET_CONFIG": str(path)}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "sql", "select 1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"tokenfleet sql: error: settings file {str(path)!r} is not valid YAML (line 2, column 6: "
        "mapping values are not allowed here)"
    ]
