"""MkDocs hooks: the settings table, generated from ``infra.settings.Settings`` at build time.

A page that holds the marker ``<!-- settings-table -->`` gets, in its place, one row per
environment variable the settings object reads: its name, type, default and the field's
description (a dash where the field has none). A field whose values are themselves settings
(``slo_classes``) gets one row per nested key as well, in the nested-delimiter form
(``TOKENFLEET_SLO_CLASSES__<NAME>__TTFT_S``). So the table cannot drift from the code.
"""

from __future__ import annotations

import html
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- settings-table -->"
NONE = "\N{EN DASH}"  # a cell with nothing to say

if str(ROOT) not in sys.path:  # the build may run from an environment without the project installed
    sys.path.insert(0, str(ROOT))


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: replace the marker with the table."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, settings_table())


def settings_table() -> str:
    """The Markdown table of every setting: variable, type, default, description."""
    from infra.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    delimiter = Settings.model_config.get("env_nested_delimiter") or "__"
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        variable = f"{prefix}{name}".upper()
        lines.append(_row(variable, field.annotation, _default(field), field.description))
        nested = _nested_settings(field.annotation)
        if nested is not None:
            for sub, subfield in nested.model_fields.items():
                sub_variable = f"{variable}{delimiter}<NAME>{delimiter}{sub.upper()}"
                lines.append(
                    _row(sub_variable, subfield.annotation, _default(subfield), subfield.description)
                )
    return "\n".join(lines)


def _row(variable: str, annotation: Any, default: Any, description: str | None) -> str:
    text = html.escape(description, quote=False) if description else NONE
    cells = [f"`{variable}`", _type_name(annotation), _shown(default), text]
    return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _default(field: Any) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def _shown(value: Any) -> str:
    """A default as an operator would write it in the environment (JSON for containers)."""
    if value is None:
        return "none"
    if value == "":
        return "empty"
    if isinstance(value, dict):
        if not value:
            return "`{}`"
        if all(hasattr(v, "model_dump") for v in value.values()):
            return ", ".join(f"`{k}`: {_compact(v.model_dump())}" for k, v in value.items())
        return f"`{value}`"
    if isinstance(value, list):
        return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 10_000:
        return f"`{value}`" + (f" ({value // 2**20} MiB)" if value % 2**20 == 0 else "")
    return f"`{value}`"


def _compact(values: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in values.items() if v not in (None, False))
    return shown or NONE


def _type_name(annotation: Any) -> str:
    """``float``, ``Path`` (optional), ``dict[str, float]`` (JSON): as a reader writes the value."""
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:
        return _type_name(next(a for a in args if a is not type(None))) + " (optional)"
    if isinstance(annotation, type) and not args:
        return f"`{annotation.__name__}`"
    name = str(annotation).replace("typing.", "").replace("pathlib.", "")
    for arg in args:
        if isinstance(arg, type):
            name = name.replace(f"{arg.__module__}.{arg.__qualname__}", arg.__qualname__)
    return f"`{name}` (JSON)" if typing.get_origin(annotation) in (dict, list) else f"`{name}`"


def _nested_settings(annotation: Any) -> Any:
    """The settings class of a ``dict[str, SomeSettings]`` field, else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2 and hasattr(args[1], "model_fields"):
        return args[1]
    return None
