"""``tokenfleet replay``: without a subcommand it says what to give; ``replay export``'s bad input
(a time, a window, an unknown or empty run) is one line and exit 2, the times read before the store
is opened. The store is a stand-in here (``tests/integration/test_replay_export.py`` runs the real one)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

import cli.store
from cli.main import main
from cli.replay import NO_SUBCOMMAND, parse_time


class EmptyStore:
    """A store that answers every query with no rows, and ``run_count`` to ``SELECT count()``."""

    def __init__(self, run_count: int) -> None:
        self.run_count = run_count
        self.closed = False

    def query(self, sql: str, parameters: Any = None) -> Any:
        class Result:
            result_rows = [(self.run_count,)] if sql.startswith("SELECT count()") else []

        return Result()

    def close(self) -> None:
        self.closed = True


def test_without_a_subcommand_it_says_what_to_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 2
    assert capsys.readouterr().err == NO_SUBCOMMAND + "\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--since", "yesterday"], "--since 'yesterday' is not a time: give Unix seconds or ISO 8601"),
        (["--until", "nan"], "--until 'nan' is not a time after 1970"),
        (
            ["--since", "2026-05-01T12:00:00", "--until", "2026-05-01T11:00:00"],
            "--since must be before --until",
        ),
        (["--run", " "], "--run must name a run"),
    ],
)
def test_bad_times_and_runs_are_one_line_before_the_store_is_opened(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str
) -> None:
    def no_store(url: str) -> None:
        raise AssertionError("the store was opened")

    monkeypatch.setattr(cli.store, "open_store", no_store)
    assert main(["replay", "export", "--run", "run-a", "--out", "out/x", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tokenfleet replay export: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("run_count", "message"),
    [(0, "no run 'run-a' in the store"), (3, "run 'run-a' has no request arriving in the window")],
)
def test_an_unknown_or_empty_run_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, run_count: int, message: str
) -> None:
    store = EmptyStore(run_count)
    monkeypatch.setattr(cli.store, "open_store", lambda url: store)
    import infra.clickhouse.migrate  # noqa: F401  (the module; the package exports its function)

    monkeypatch.setattr(sys.modules["infra.clickhouse.migrate"], "migrate", lambda client: [])
    assert main(["replay", "export", "--run", "run-a", "--since", "1700000000", "--out", "out/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tokenfleet replay export: error: {message}") and err.count("\n") == 1
    assert store.closed


def test_times_are_unix_seconds_or_iso_8601_utc_unless_an_offset_is_given() -> None:
    assert parse_time("1700000000.5", "--since") == 1_700_000_000.5
    assert parse_time("2023-11-14T22:13:20", "--since") == 1_700_000_000.0
    assert parse_time("2023-11-15 00:13:20+02:00", "--since") == 1_700_000_000.0
