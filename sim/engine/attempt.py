"""One attempt of a request: what the client sent, and what happened to it on its instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.workloads.trace import TraceRequest

if TYPE_CHECKING:
    from sim.engine.instance import Instance


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt of a request: what the client sent and what happened to it."""

    request: TraceRequest
    attempt: int
    arrival_s: float
    output_budget: int
    predicted_ttft_s: float | None = None  # the router's prediction, if its policy makes one
    dc: str = ""  # where the router sent it ("" = not sent)
    sent_s: float | None = None  # when the router sent it
    return_s: float = 0.0  # from its instance back to the client: the network's one way, plus the
    # profile's ``token_delay_s`` (detokenizing, the API server, the stream)
    # Filled in by the instance:
    instance: Instance | None = None
    cached_tokens: int = 0
    prefill_left: int = 0
    context: int = 0
    generated: int = 0
    admitted_s: float | None = None  # first scheduled (vLLM's SCHEDULED event)
    first_token_s: float | None = None
    end_s: float | None = None
    tokens_in_window: int | None = None  # set for attempts still running when the window closes
    status: str = "pending"  # pending -> ok | aborted | rejected | failed (its DC went down)
    abort_requested: bool = False
    keyed_blocks: list[int] = field(default_factory=list)
    anonymous_blocks: int = 0
    blocks: int = 0  # engine KV blocks it holds (keyed + anonymous; ``EngineProfile.kv_block_tokens``)
    preemptions: int = 0
    busy_s: float = 0.0  # its share of its instance's busy time (``Instance._account_busy``)
    # Prefill/decode disaggregation: on a decode instance, its prompt's KV arrived computed
    # (``kv_received``); on a prefill instance, the leg that computes it for ``client`` (the
    # attempt its client waits on), ending with that one token.
    kv_received: bool = False
    client: Attempt | None = None
    retried: bool = False  # its client retries it: the request is not over when it ends

    @property
    def target_tokens(self) -> int:
        """Tokens the engine will generate: the true length, capped by the client's budget."""
        return min(self.request.output_tokens, self.output_budget)
