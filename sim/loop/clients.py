"""How emulated clients behave: the rules the discrete-event loop and the real-time driver share.

- Without a first token, a client gives up at ``SloClass.give_up_at``: ``client_timeout_s``
  after the attempt's arrival, or, for deadline classes (batch), at the request's deadline.
- Once its response streams, a client of a non-deadline class waits for the rest; a deadline
  class still gives up at the deadline.
- A share (``retry_share``) of given-up interactive first attempts is retried once, at once. Which
  ones is a fixed, seeded property of the request, so it is the same under every policy. The
  real-time driver emulates no retries (``retry_share=0``): there, they are the real client's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from agents.policy.common.slo import SloClass
from sim.engine.attempt import Attempt


@dataclass(frozen=True, slots=True)
class ClientRules:
    slo_classes: Mapping[str, SloClass]
    seed: int = 0
    retry_share: float = 0.0

    def give_up_at(self, attempt: Attempt, deadline_s: float | None) -> float | None:
        """When the client gives up on ``attempt`` (absolute ``deadline_s`` for deadline classes);
        None: it waits for ever (also for a class it does not know)."""
        slo = self.slo_classes.get(attempt.request.slo_class)
        return None if slo is None else slo.give_up_at(attempt.arrival_s, deadline_s)

    def still_gives_up(self, attempt: Attempt) -> bool:
        """Whether a give-up due now applies: no first token yet, or a deadline class."""
        slo = self.slo_classes.get(attempt.request.slo_class)
        return attempt.first_token_s is None or (slo is not None and slo.deadline)

    def retries(self, attempt: Attempt) -> bool:
        """Whether the client retries ``attempt`` after giving up on it."""
        return (
            attempt.attempt == 1
            and attempt.request.slo_class == "interactive"
            and self.retried(attempt.request.request_id)
        )

    def retried(self, request_id: str) -> bool:
        """The seeded coin of ``request_id``: True for a ``retry_share`` of all requests."""
        digest = hashlib.blake2b(f"{self.seed}:{request_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.retry_share
