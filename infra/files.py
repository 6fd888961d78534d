"""Files a user or an operator names: reading one (one line saying what is wrong, never a
traceback), and writing one whole (a reader never sees half of it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document at ``path``; ``ValueError`` naming ``what`` and the file (and, for a
    syntax error, its line, column and problem, both counted from 1) when it cannot be read or
    parsed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None)
        detail = f": {problem}" if problem else ""
        at = f" (line {where.line + 1}, column {where.column + 1}{detail})" if where is not None else ""
        raise ValueError(f"{what} {str(path)!r} is not valid YAML{at}") from None


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` whole: into a temporary file beside it (created with ``mode``, less the
    umask), then renamed over it, so a reader sees the old file or the new one, never half."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.replace(partial, path)
