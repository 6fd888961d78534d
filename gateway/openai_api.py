"""The OpenAI API as the gateway speaks it: client bodies in, TokenFleet requests and answers out.

``parse_body`` validates a ``/v1/chat/completions`` or ``/v1/completions`` body into an
``InferenceRequest`` (prompt, ``max_tokens`` as the output budget, sampling by their OpenAI
names) or raises ``ApiError`` (HTTP 400 with OpenAI's error shape, ``param`` naming the field
as the client sent it: never an internal name). ``assembled`` builds the
non-streamed answer from what the engine streamed (the gateway always streams from the engine,
so it sees the first token). ``session_id`` names a client's session on the bus and in the store
without its user's id. ``rejection`` maps an admission reject onto HTTP: ``over_quota`` is
429, every other reason 503, with ``Retry-After`` when the scheduler gave a hint.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from infra.vllm.openai_http import Generation
from schemas.events import MAX_TOKENS, AdmissionDecision, ChatMessage, InferenceRequest, Sampling

Kind = Literal["chat", "completion"]
DEFAULT_MAX_TOKENS = {"chat": 256, "completion": 16}
"""``max_tokens`` when the client sends none: OpenAI's 16 for completions; chats get 256 here
(OpenAI's "up to the context" would make every chat's budget the model's whole context)."""
_UNSUPPORTED = ("n", "best_of", "tools", "functions", "response_format", "logprobs", "echo", "suffix")
_USED = frozenset(
    {"model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens"}
    | {"stop", "user", "temperature", "top_p", "seed", "ignore_eos", *_UNSUPPORTED}
)
"""The body fields the gateway reads; any other is ignored (not sent to the engine) and named in
the call's access line, as vLLM names the fields it ignores: OpenAI's SDKs send vendor fields
(``extra_body``) that one server takes and another does not, so refusing them would break
clients that work against vLLM."""


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    param: str | None = None

    def body(self) -> dict[str, Any]:
        """OpenAI's error JSON."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ClientCall:
    """What the client asked for, beside the request itself."""

    kind: Kind
    stream: bool
    include_usage: bool
    client_model: str
    user: str = ""  # the body's ``user``: an end-user id for the logs, never the tenant
    ignored: tuple[str, ...] = ()  # the body's fields the gateway does not use (sorted)


def session_id(tenant: str, user: str) -> str:
    """The request's ``session_id`` for a client's ``user`` (or session name) in ``tenant``:
    blake2b (8 bytes, hex) of the pair, so the raw id never leaves the gateway and two tenants'
    ``alice`` are two sessions. It is a pseudonym, not a secret: whoever knows the tenant and
    guesses an id can compute it. No user: ``""`` (no session)."""
    if not user:
        return ""
    pair = json.dumps([tenant, user]).encode()  # unambiguous: ("a", "bc") and ("ab", "c") differ
    return hashlib.blake2b(pair, digest_size=8).hexdigest()


def parse_body(
    kind: Kind,
    body: Any,
    request_id: str,
    tenant: str,
    slo_class: str | None,
    known_models: set[str],
    session: str = "",
) -> tuple[InferenceRequest, ClientCall]:
    """``session``: the caller's own session name (a header), which wins over the body's
    ``user``; either becomes the request's ``session_id`` (the function ``session_id``)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", code="missing_model", param="model")
    if model not in known_models:
        raise ApiError(
            404, f"the model {model[:256]!r} does not exist here", code="model_not_found", param="model"
        )
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, False, 1):
            raise ApiError(
                400, f"'{name}' is not supported by this gateway", code="unsupported_parameter", param=name
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    budget_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(budget_name)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS[kind]
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise ApiError(400, f"'{budget_name}' must be an integer from 1 to {MAX_TOKENS}", param=budget_name)
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    prompt: dict[str, Any] = {}
    prompt_name = "messages" if kind == "chat" else "prompt"
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list", param="messages")
        prompt["messages"] = tuple(_message(m, i) for i, m in enumerate(messages))
    else:
        text = body.get("prompt")
        if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str | list):
            text = text[0]  # one prompt in a list
        if isinstance(text, str) and text:
            prompt["prompt"] = text
        elif (
            isinstance(text, list)
            and text
            and all(isinstance(t, int) and not isinstance(t, bool) for t in text)
        ):
            prompt["prompt_token_ids"] = tuple(text)
        else:
            raise ApiError(
                400, "'prompt' must be one non-empty string or a list of token ids", param="prompt"
            )
    try:
        sampling = Sampling(
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            seed=body.get("seed"),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
    except ValidationError as exc:
        raise _invalid(exc, {}, "body") from None
    try:
        request = InferenceRequest(
            request_id=request_id,
            tenant=tenant,
            model=model,
            task_type="chat" if kind == "chat" else "completion",
            output_budget=max_tokens,
            slo_class=slo_class,
            sampling=sampling,
            reply="http",
            session_id=session_id(tenant, session or user or ""),
            **prompt,
        )
    except ValidationError as exc:
        raise _invalid(
            exc, {"output_budget": budget_name, "prompt_token_ids": "prompt"}, prompt_name
        ) from None
    ignored = tuple(sorted(str(name)[:64] for name in body if name not in _USED))
    return request, ClientCall(kind, stream, include_usage, model, user or "", ignored)


def _invalid(exc: ValidationError, public: dict[str, str], whole: str) -> ApiError:
    """A 400 for pydantic's first complaint, named by the client's field (``public`` maps the
    internal names; a complaint about the whole request is about ``whole``, the prompt)."""
    first = exc.errors()[0]
    location = [str(p) for p in first.get("loc", ())]
    param = public.get(location[0], location[0]) if location else whole
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    for internal, name in public.items():
        message = message.replace(internal, name)
    return ApiError(400, f"invalid '{param}': {message}", param=param)


def _message(raw: Any, index: int) -> ChatMessage:
    if not isinstance(raw, dict):
        raise ApiError(400, f"messages[{index}] must be an object", param="messages")
    content = raw.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content):
            raise ApiError(400, f"messages[{index}]: only text content is supported", param="messages")
        content = "".join(str(p) for p in parts)
    try:
        return ChatMessage.model_validate({"role": raw.get("role"), "content": content or ""})
    except ValidationError as exc:
        raise ApiError(400, f"messages[{index}]: {exc.errors()[0].get('msg')}", param="messages") from None


def assembled(call: ClientCall, response_id: str, generation: Generation) -> dict[str, Any]:
    """The non-streamed OpenAI answer for what the engine streamed (``response_id``: its ``id``)."""
    usage = {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }
    if generation.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": generation.cached_tokens}  # type: ignore[assignment]
    choice: dict[str, Any] = {"index": 0, "finish_reason": generation.finish_reason, "logprobs": None}
    if call.kind == "chat":
        choice["message"] = {"role": "assistant", "content": generation.text}
        obj = "chat.completion"
    else:
        choice["text"] = generation.text
        obj = "text_completion"
    return {
        "id": response_id,
        "object": obj,
        "created": int(time.time()),
        "model": call.client_model,
        "choices": [choice],
        "usage": usage,
    }


def rejection(answer: AdmissionDecision) -> ApiError:
    code = answer.reason.split(":", 1)[0].strip() or "rejected"
    headers = {}
    if answer.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(answer.retry_after_s)))
    status = 429 if code == "over_quota" else 503
    kind = "rate_limit_exceeded" if status == 429 else "service_unavailable"
    return ApiError(status, f"not admitted: {answer.reason}", type=kind, code=code, headers=headers)
