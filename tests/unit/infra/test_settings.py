"""The settings file's errors: one line naming the file (and the line and column of a YAML
syntax error, or the refused setting and where its value came from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import ConfigError, Settings, read_settings


def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "tokenfleet.yaml"
    path.write_text(text)
    monkeypatch.setenv("TOKENFLEET_CONFIG", str(path))
    return path


def test_a_yaml_syntax_error_names_the_file_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = settings_file(tmp_path, monkeypatch, "policy: tokenpilot\n  bad: [\n")
    with pytest.raises(ConfigError) as caught:
        read_settings()
    message = str(caught.value)
    assert str(path) in message and "line 2, column 6" in message
    assert "mapping values are not allowed here" in message and "\n" not in message
    with pytest.raises(ConfigError, match="line 2, column 6"):
        Settings()  # every reader of the settings, not only the loader


def test_a_list_is_not_a_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = settings_file(tmp_path, monkeypatch, "- policy\n- tokenpilot\n")
    with pytest.raises(ConfigError, match="must be a mapping") as caught:
        read_settings()
    assert str(path) in str(caught.value)


def test_an_empty_settings_file_is_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file(tmp_path, monkeypatch, "# nothing set yet\n")
    assert read_settings().policy == Settings.model_fields["policy"].default


def test_a_refused_value_names_the_file_and_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = settings_file(
        tmp_path, monkeypatch, "polcy: tokenpilot\nslo_classes:\n  interactive:\n    ttft_s: fast\n"
    )
    with pytest.raises(ConfigError) as caught:
        read_settings()
    message = str(caught.value)
    assert f"settings file {str(path)!r}, setting polcy: not a setting" in message
    assert f"settings file {str(path)!r}, setting slo_classes.interactive.ttft_s:" in message
    assert "fast" not in message and "\n" not in message  # values are never repeated (secrets)


def test_a_refused_value_from_the_environment_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_file(tmp_path, monkeypatch, "topic_partitions: 4\n")
    monkeypatch.setenv("TOKENFLEET_TOPIC_PARTITIONS", "many")  # the environment wins over the file
    with pytest.raises(ConfigError, match=r"^TOKENFLEET_TOPIC_PARTITIONS: .*integer"):
        read_settings()


def test_a_refused_argument_is_named_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENFLEET_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"^topic_partitions \(as given\): "):
        read_settings(topic_partitions="many")
