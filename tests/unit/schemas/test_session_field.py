"""A request's ``session_id``: a request made before it existed decodes with none (``""``), a
session round-trips, and it is bounded like every label (refused naming the field)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.codec import DecodeError, decode, encode
from schemas.events import MAX_NAME_LENGTH, InferenceRequest

OLD_REQUEST: dict[str, Any] = {"request_id": "r1", "model": "m", "input_tokens": 600, "output_budget": 16}


def test_an_old_request_has_no_session() -> None:
    assert decode(InferenceRequest, json.dumps(OLD_REQUEST).encode()).session_id == ""
    assert InferenceRequest(**OLD_REQUEST).session_id == ""


def test_a_session_round_trips() -> None:
    request = InferenceRequest(**OLD_REQUEST, session_id="9f86d081884c7d65")
    assert decode(InferenceRequest, encode(request)) == request


def test_a_session_longer_than_a_label_is_refused_naming_the_field() -> None:
    too_long = json.dumps({**OLD_REQUEST, "session_id": "s" * (MAX_NAME_LENGTH + 1)}).encode()
    with pytest.raises(DecodeError, match="session_id"):
        decode(InferenceRequest, too_long)
