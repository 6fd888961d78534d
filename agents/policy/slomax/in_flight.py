"""What SLOMax's admitted requests hold of the pool until they end: the in-flight ledger.

One entry per admitted request attempt (its own, or another decider's read from the decision
log: both are counted alike), from its admission to its end:

- its tokens (input + output budget) in its class's and its tenant's tallies (batch share,
  tenant quota, fair parts);
- its fair-queuing charge (``fairness.VirtualTokenCounter``), settled with its true output;
- once placed, its own prefill seconds on its instance (``placement.PrefillLoad``: prefill room)
  and, a long prompt, its slot in that instance's long-prompt count, both until its first token.

An entry is added once: a request offered again after its admission (held for capacity by the
pipeline) is not counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.policy.common.slo import LONG_CONTEXT
from agents.policy.slomax.fairness import VirtualTokenCounter
from agents.policy.slomax.placement import PrefillLoad
from agents.policy.types import RequestView

Key = tuple[str, int]  # (request id, attempt)


@dataclass(slots=True)
class Entry:
    slo_class: str
    tenant: str
    tokens: int  # input + output budget: what it may hold of the pool's capacity
    prefill_s: float  # its own predicted prefill time
    input_tokens: int
    predicted_s: float | None  # the TTFT admission predicted were it sent then (None: another's)
    waited_s: float  # how long it had waited when admitted
    prefilling: bool = True
    instance_id: str = ""  # where it was placed (once known)


class InFlight:
    """The ledger of the module docstring. ``class_tokens``, ``tenant_tokens`` (a tenant with
    nothing in flight is absent) and ``long_on`` (instance id -> long prompts placed there and
    still prefilling) are read by the stage; only the ledger writes them."""

    def __init__(self, fair: VirtualTokenCounter, prefill: PrefillLoad) -> None:
        self._fair = fair
        self._prefill = prefill
        self._entries: dict[Key, Entry] = {}
        self.class_tokens: dict[str, int] = {}
        self.tenant_tokens: dict[str, int] = {}
        self.long_on: dict[str, int] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def admit(
        self,
        request: RequestView,
        slo_class: str,
        weight: float,
        prefill_s: float,
        predicted_s: float | None,
        now_s: float,
    ) -> bool:
        """Count an admitted request in flight (False: it already was)."""
        if request.key in self._entries:
            return False
        tokens = request.input_tokens + request.output_budget
        waited = now_s - request.arrival_s
        self._entries[request.key] = Entry(
            slo_class, request.tenant, tokens, prefill_s, request.input_tokens, predicted_s, waited
        )
        self.class_tokens[slo_class] = self.class_tokens.get(slo_class, 0) + tokens
        self.tenant_tokens[request.tenant] = self.tenant_tokens.get(request.tenant, 0) + tokens
        self._fair.charge(request.key, request.tenant, weight, request.input_tokens, request.output_budget)
        return True

    def place(self, key: Key, instance_id: str, now_s: float) -> None:
        """The request runs on ``instance_id`` from ``now_s``: its prefill counts there."""
        entry = self._entries.get(key)
        if entry is None or not entry.prefilling or entry.instance_id:
            return
        entry.instance_id = instance_id
        self._prefill.add(instance_id, entry.prefill_s, now_s)
        if entry.slo_class == LONG_CONTEXT:
            self.long_on[instance_id] = self.long_on.get(instance_id, 0) + 1

    def first_token(self, key: Key) -> Entry | None:
        """Its prefill is done (its entry, to learn from; None: not in flight here)."""
        entry = self._entries.get(key)
        if entry is not None:
            self._prefilled(entry)
        return entry

    def finish(self, key: Key, output_tokens: int) -> None:
        """It ended with ``output_tokens``: everything it held is released."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._prefilled(entry)
        self.class_tokens[entry.slo_class] -= entry.tokens
        left = self.tenant_tokens[entry.tenant] - entry.tokens
        if left:
            self.tenant_tokens[entry.tenant] = left
        else:  # (a tenant with nothing in flight leaves the tally the fair part scans)
            del self.tenant_tokens[entry.tenant]
        self._fair.settle(key, output_tokens)

    def _prefilled(self, entry: Entry) -> None:
        if not entry.prefilling:
            return
        entry.prefilling = False
        if entry.slo_class == LONG_CONTEXT and entry.instance_id:
            left = self.long_on[entry.instance_id] - 1
            if left:
                self.long_on[entry.instance_id] = left
            else:
                del self.long_on[entry.instance_id]
