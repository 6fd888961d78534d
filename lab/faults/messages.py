"""The fault suite's messages: valid requests, fuzzed ones and poison pills (each bad one checked
never to decode as a request, so every one of them must be dead-lettered). Seeded."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from lab.faults import MODEL
from schemas.codec import DecodeError, decode, encode
from schemas.events import InferenceRequest


def valid_request(rng: random.Random, request_id: str, **fields: Any) -> InferenceRequest:
    """A valid request of the fleet's pool drawn from ``rng`` (``fields`` override), with an
    event id from ``rng`` too, so a seeded run sends the same bytes."""
    input_tokens = rng.randint(300, 2500)
    blocks = input_tokens // 512
    values: dict[str, Any] = {
        "request_id": request_id,
        "model": MODEL,
        "tenant": f"tenant-{rng.randrange(4)}",
        "input_tokens": input_tokens,
        "output_budget": rng.randint(4, 48),  # the emulated fleet generates the whole budget
        "prompt_block_hashes": tuple(rng.getrandbits(62) for _ in range(blocks)),
        "event_id": f"{rng.getrandbits(128):032x}",
    }
    values.update(fields)
    return InferenceRequest(**values)


def _mutations() -> list[Callable[[random.Random, dict[str, Any]], bytes]]:
    def random_bytes(rng: random.Random, base: dict[str, Any]) -> bytes:
        return rng.randbytes(rng.randint(0, 400))

    def truncated(rng: random.Random, base: dict[str, Any]) -> bytes:
        raw = json.dumps(base).encode()
        return raw[: rng.randint(0, len(raw) - 1)]

    def wrong_type(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(["request_id", "model", "input_tokens", "output_budget", "attempt", "ts"])
        base[name] = rng.choice([[1, 2], {"a": 1}, True, None, "many", -3.5, ""])
        return json.dumps(base).encode()

    def huge_number(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(
            ["input_tokens", "output_budget", "attempt", "ts", "deadline_ts", "prompt_block_hashes"]
        )
        raw = json.dumps({**base, name: 0}).encode()
        digits = "9" * rng.randint(12, 5000) if rng.random() < 0.5 else f"1e{rng.randint(20, 400)}"
        sign = "-" if rng.random() < 0.2 else ""
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {sign}{digits}'.encode())

    def not_finite(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(["input_tokens", "ts", "deadline_ts", "output_budget"])
        raw = json.dumps({**base, name: 0}).encode()
        token = rng.choice(["NaN", "Infinity", "-Infinity"])
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {token}'.encode())

    def extra_field(rng: random.Random, base: dict[str, Any]) -> bytes:
        base[rng.choice(["x", "priority", "__proto__", "Model", "requestId"])] = rng.random()
        return json.dumps(base).encode()

    def missing_field(rng: random.Random, base: dict[str, Any]) -> bytes:
        base.pop(rng.choice(["request_id", "model", "input_tokens", "output_budget"]))
        return json.dumps(base).encode()

    def not_an_object(rng: random.Random, base: dict[str, Any]) -> bytes:
        return json.dumps(rng.choice([[base], 42, "request", None, [], True])).encode()

    def bad_utf8(rng: random.Random, base: dict[str, Any]) -> bytes:
        raw = json.dumps(base).encode()
        return raw.replace(b'"model": "', b'"model": "\xff\xfe', 1)

    return [
        random_bytes,
        truncated,
        wrong_type,
        huge_number,
        not_finite,
        extra_field,
        missing_field,
        not_an_object,
        bad_utf8,
    ]


def fuzzed_messages(count: int, seed: int = 0) -> list[bytes]:
    """``count`` seeded mutations of valid requests, each checked to be invalid (a mutation that
    happens to decode as a request is drawn again), so every one of them must be dead-lettered."""
    rng = random.Random(seed)
    mutations = _mutations()
    out: list[bytes] = []
    while len(out) < count:
        base = json.loads(encode(valid_request(rng, f"fuzz-{len(out)}", ts=1.7e9 + rng.random())))
        raw = rng.choice(mutations)(rng, base)
        try:
            decode(InferenceRequest, raw)
        except DecodeError:
            out.append(raw)
    return out


def poison_pills(rng: random.Random) -> dict[str, bytes]:
    """The named poison pills: bounded fields pushed far out of range, and a 5 MB message."""

    def with_raw(name: str, literal: str) -> bytes:
        raw = json.dumps({**json.loads(encode(valid_request(rng, f"pill-{name}"))), name: 0}).encode()
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {literal}'.encode())

    huge = json.loads(encode(valid_request(rng, "pill-5mb")))
    huge["prompt_block_hashes"] = [rng.getrandbits(62) for _ in range(270_000)]  # > MAX_BLOCK_HASHES
    pills = {
        "attempt_1e6": with_raw("attempt", "1000000"),
        "input_tokens_1e12": with_raw("input_tokens", "1000000000000"),
        "deadline_ts_nan": with_raw("deadline_ts", "NaN"),
        "deadline_ts_1e20": with_raw("deadline_ts", "1e20"),
        "ts_1e20": with_raw("ts", "1e20"),
        "5mb": json.dumps(huge).encode(),
    }
    for name, raw in pills.items():
        try:
            decode(InferenceRequest, raw)
        except DecodeError:
            continue
        raise AssertionError(f"the poison pill {name} decodes as a valid request")
    return pills
