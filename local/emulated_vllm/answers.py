"""What an emulated call answers: its length, its text, and the OpenAI chunks that stream it (pure).

The non-streamed answer is the gateway's own (``gateway.openai_api.assembled``); the chunks here
are shaped as vLLM 0.32 streams them: a chat's first chunk carries ``{"role": "assistant",
"content": ""}`` and goes out with the first token, then one chunk per group of tokens, the
last with its ``finish_reason``; with usage asked for, a closing chunk with no choices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.openai_api import Kind

NATURAL_MAX_TOKENS = 512
"""The longest answer the emulated model gives when only its own end-of-sequence stops it."""

_WORDS = ("emulated", "tokens", "flow", "through", "the", "fleet", "at", "the", "engine's", "pace")


def answer_length(prompt_ids: Sequence[int], max_tokens: int, ignore_eos: bool) -> tuple[int, str]:
    """(output tokens, ``finish_reason``) of a call.

    ``ignore_eos``: ``(max_tokens, "length")``. Otherwise the prompt decides where the model
    would stop, ``natural = 1 + H(prompt_ids) mod NATURAL_MAX_TOKENS`` with ``H`` the 64-bit
    BLAKE2b of the ids (4 bytes each, little-endian): ``(natural, "stop")`` if ``natural <=
    max_tokens``, else ``(max_tokens, "length")``. The same prompt always gets the same length.
    """
    if ignore_eos:
        return max_tokens, "length"
    digest = hashlib.blake2b(np.asarray(prompt_ids, dtype="<u4").tobytes(), digest_size=8).digest()
    natural = 1 + int.from_bytes(digest, "little") % NATURAL_MAX_TOKENS
    return (natural, "stop") if natural <= max_tokens else (max_tokens, "length")


def token_text(first: int, last: int) -> str:
    """The text of output tokens ``first`` .. ``last - 1`` (0-based): one word each."""
    return "".join(" " + _WORDS[index % len(_WORDS)] for index in range(first, last))


def chunk(
    kind: Kind,
    response_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None = None,
    *,
    role: bool = False,
) -> dict[str, Any]:
    """One streamed chunk with ``text`` (``role``: a chat's first chunk, which names the role)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if kind == "chat":
        choice["delta"] = {"role": "assistant", "content": text} if role else {"content": text}
        kind_name = "chat.completion.chunk"
    else:
        choice["text"] = text
        choice["stop_reason"] = None
        kind_name = "text_completion"
    return {"id": response_id, "object": kind_name, "created": created, "model": model, "choices": [choice]}


def usage_chunk(
    kind: Kind, response_id: str, model: str, created: int, usage: dict[str, Any]
) -> dict[str, Any]:
    """The closing chunk of a stream whose client asked for usage (``stream_options``)."""
    kind_name = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {
        "id": response_id,
        "object": kind_name,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage``, with vLLM's ``prompt_tokens_details`` (``--enable-prompt-tokens-details``)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
