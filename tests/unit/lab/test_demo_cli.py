"""``python -m lab.demo_cli``: the demo's command line refuses bad input in one line (exit 2)
before anything starts, and is no ``tokenfleet`` command (the wheel holds the product only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.demo_cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "0"], "--duration"),
        (["--duration", "nan"], "--duration"),
        (["--rate-scale", "0"], "--rate-scale"),
        (["--concurrency", "0"], "--concurrency"),
        (["--engine", "tpu"], "--engine"),
        (["--policy", "no-such-router"], "no-such-router"),
        (["--fleet", "3xno-such-profile", "--duration", "1"], "no-such-profile"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m lab.demo_cli: error: ") and message in err, err


def test_the_demo_is_no_tokenfleet_command(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main as tokenfleet

    assert tokenfleet(["demo"]) == 2
    assert "No such command 'demo'" in capsys.readouterr().err
