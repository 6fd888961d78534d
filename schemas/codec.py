"""One codec for every pydantic event: JSON bytes on the wire, a reason when it cannot decode."""

from __future__ import annotations

import base64
import hashlib
from typing import TypeVar

from pydantic import ValidationError

from schemas.events import MAX_DEAD_LETTER_ORIGINAL, DeadLetter, Event

E = TypeVar("E", bound=Event)

RawMessage = tuple[bytes | None, bytes | None]
"""(key, value) of one message as the broker delivered it."""


class DecodeError(ValueError):
    """The bytes are not a valid event of the expected kind; ``reason`` says why, briefly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()


def decode(kind: type[E], raw: bytes | None) -> E:
    """Parse ``raw`` as ``kind``; raise ``DecodeError`` with a one-line reason otherwise."""
    if raw is None:
        raise DecodeError("empty message (no value)")
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(root)"
        kind_name = "invalid JSON" if first.get("type") == "json_invalid" else f"invalid {kind.__name__}"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DecodeError(f"{kind_name}: {where}: {first.get('msg')}{more}") from None


def dead_letter(source_topic: str, raw: bytes | None, key: bytes | None, reason: str) -> DeadLetter:
    """The DLQ record of an input we could not process: its original bytes (at most
    ``MAX_DEAD_LETTER_ORIGINAL`` of them, with the whole original's size and SHA-256) and why."""
    original = raw or b""
    kept = original[:MAX_DEAD_LETTER_ORIGINAL]
    return DeadLetter(
        source_topic=source_topic,
        reason=reason,
        original_b64=base64.b64encode(kept).decode(),
        original_key_b64=None if key is None else base64.b64encode(key[:MAX_DEAD_LETTER_ORIGINAL]).decode(),
        original_size=len(original),
        original_sha256=hashlib.sha256(original).hexdigest(),
        truncated=len(kept) < len(original),
    )
