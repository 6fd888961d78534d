"""A request's prompt as the engine will see it: token ids, their count and block hashes.

``PromptTokenizer`` tokenizes like vLLM's OpenAI server does: a completion's text with the
tokenizer's special tokens (BOS where its post-processor adds one), a chat rendered with the
model's ``chat_template`` (Jinja, from ``tokenizer_config.json``, ``add_generation_prompt``) and
tokenized without adding special tokens (the template writes them), token ids as they are.
``Prompts.complete`` fills ``input_tokens`` and ``prompt_block_hashes`` of a request that carries
a prompt but not them (the worker does it before routing; the gateway before publishing), so
the prefix index compares what the engines cache (``dispatcher/engines/vllm/kv_events.py`` hashes the
same token ids). A mismatch with the engine's own tokenization costs cache affinity, never
correctness: the engine tokenizes the prompt it is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from agents.prompt_blocks import chained_block_hashes
from schemas.events import MAX_TOKENS, InferenceRequest

THREAD_PROMPT_CHARS = 16_384
"""Prompts this long or longer are tokenized on a worker thread (milliseconds of tokenizing or more)."""


class PromptError(ValueError):
    """The request's prompt cannot be tokenized here (no tokenizer for its model, a bad template)."""


class PromptTokenizer:
    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, special: Mapping[str, str]) -> None:
        self._tokenizer = tokenizer
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = None if chat_template is None else env.from_string(chat_template)
        self._special = dict(special)

    @classmethod
    def from_dir(cls, directory: Path) -> PromptTokenizer:
        """From a model directory's ``tokenizer.json`` and (optional) ``tokenizer_config.json``."""
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise PromptError(f"cannot load {directory / 'tokenizer.json'}: {exc}") from None
        config: dict[str, Any] = {}
        config_path = directory / "tokenizer_config.json"
        if config_path.exists():
            config = json.loads(config_path.read_text())
        special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}
        return cls(tokenizer, config.get("chat_template"), special)

    def token_ids(self, request: InferenceRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if request.prompt is not None:
            return self._encode(request.prompt, add_special_tokens=True)
        if request.messages is not None:
            if self._template is None:
                raise PromptError(f"the tokenizer of model {request.model!r} has no chat_template")
            text = self._template.render(
                messages=[m.model_dump() for m in request.messages],
                add_generation_prompt=True,
                **self._special,
            )
            return self._encode(text, add_special_tokens=False)
        return []

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch, not encode: the Rust tokenizer releases the GIL only in the batch call
        # (docs/results/speed.md, "A long prompt and the gateway's event loop"), so a caller may
        # tokenize off its event loop.
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)


class Prompts:
    """Per model pool, the tokenizer its engines use."""

    def __init__(self, tokenizers: Mapping[str, PromptTokenizer]) -> None:
        self._tokenizers = dict(tokenizers)

    @classmethod
    def from_dirs(cls, directories: Mapping[str, Path]) -> Prompts:
        return cls({model: PromptTokenizer.from_dir(path) for model, path in directories.items()})

    async def complete_off_loop(self, request: InferenceRequest) -> InferenceRequest:
        """``complete``, with a long prompt tokenized on a worker thread so that the caller's
        event loop keeps serving meanwhile (a thread costs more than a short prompt takes)."""
        if _prompt_chars(request) < THREAD_PROMPT_CHARS:
            return self.complete(request)
        return await asyncio.to_thread(self.complete, request)

    def complete(self, request: InferenceRequest) -> InferenceRequest:
        """``request`` with ``input_tokens`` and ``prompt_block_hashes`` of its prompt (unchanged
        if it has no prompt or already carries both). Raises ``PromptError``."""
        if not request.has_prompt or (request.input_tokens and request.prompt_block_hashes):
            return request
        if request.prompt_token_ids is not None:
            ids: list[int] = list(request.prompt_token_ids)
        else:
            tokenizer = self._tokenizers.get(request.model)
            if tokenizer is None:
                raise PromptError(
                    f"no tokenizer for model {request.model!r}: send input_tokens and prompt_block_hashes, "
                    "or list the model's tokenizer in the inventory"
                )
            ids = tokenizer.token_ids(request)
        if not ids:
            raise PromptError("the prompt is empty once tokenized")
        if len(ids) > MAX_TOKENS:
            raise PromptError(f"the prompt has {len(ids)} tokens, more than {MAX_TOKENS}")
        update: dict[str, Any] = {"input_tokens": request.input_tokens or len(ids)}
        if not request.prompt_block_hashes:
            update["prompt_block_hashes"] = chained_block_hashes(ids)
        return request.model_copy(update=update)


def _token_text(value: Any) -> str:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _prompt_chars(request: InferenceRequest) -> int:
    if request.prompt is not None:
        return len(request.prompt)
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    return 0
