"""How an exception is named in one log line or one event field."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """``TypeName: first line of its message`` (just ``TypeName`` when the message is empty)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
