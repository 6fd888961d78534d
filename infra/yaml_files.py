"""Reading a configuration file a user names: one line saying what is wrong, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document at ``path``; ``ValueError`` naming ``what`` and the file (and the line
    of a syntax error) when it cannot be read or parsed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ValueError(f"{what} {str(path)!r} is not valid YAML{line}") from None
