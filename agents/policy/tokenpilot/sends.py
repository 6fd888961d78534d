"""What the TokenPilot router remembers of each request it (or another decider of the pool) sent,
from the send to its end: where it went, its queue mark, the features and prediction calibration
learns from; and what ``pick`` decided, for ``on_routed`` to record."""

from __future__ import annotations

from dataclasses import dataclass

from agents.policy.common.numeric import FloatArray
from agents.policy.tokenpilot.pairs import Pair


@dataclass(slots=True)
class Sent:
    instance_id: str
    profile: str
    features: FloatArray
    tokens: float  # its uncached prompt tokens and their pairs, as added to the queue
    pairs: float
    predicted_s: float  # its predicted TTFT, as the model gave it
    due_s: float  # predicted first token (the prediction stretched by the lateness of its size)
    waits_for_step: bool  # sent to a busy instance: it starts at the next step boundary
    mark: tuple[float, float]  # its instance's tokens and pairs ever sent, it included
    waited_s: float = 0.0  # from its arrival to its send (a hold): not the instance's doing
    own: bool = True  # False: another decider's placement (it calibrates nothing here)


@dataclass(slots=True)
class Chosen:
    """What ``pick`` decided, for ``on_routed`` to record (computed once, used twice)."""

    now_s: float
    features: FloatArray
    predicted_s: float
    tokens: float
    pairs: float
    joined_tokens: float  # of its first chunk, run in the step that ends the last queued request
    joined_pairs: float
    prefill_s: float  # its own predicted prefill seconds there (what the decodes' harm counts)
    pair: Pair | None = None  # disaggregated: prefilled on ``pair.prefill`` (what the rest is of)
