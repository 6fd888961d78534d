"""Prefill/decode disaggregation in the discrete-event loop: a request served on a pair.

An admit with a ``prefill_instance`` (``agents.policy.types.Outcome``) runs in three legs:

1. **Prefill**: a leg attempt (``Attempt.client`` = the client's attempt, output budget 1)
   reaches the prefill instance as any attempt reaches its instance (r/2 after the decision)
   and is scheduled there like any other request: it reuses the prefix that instance holds,
   and its prompt's blocks stay in that instance's prefix cache afterwards. The token it yields
   is not the client's (a proxy discards it). The router sees ``PrefillDone``.
2. **Transfer**: the scheduler binds the decode instance (a policy may keep the one it decided,
   or pick another of the DC on the newest snapshot: ``bind_decode``); the prompt's KV cache it
   does not hold yet (its resident prefix is not moved, as vLLM's connectors load only the
   tokens beyond the decode side's own prefix hit), ``kv_bytes_per_token`` (the prefill
   instance's profile) per token, crosses the DC's link (``kv_link_gbps``) to it.
   Transfers share a DC's link first come first served (``KvLinks``): one waits while the link
   moves those ahead of it.
3. **Decode**: the client's attempt then joins that instance's queue with its prompt
   computed but for the last token (``Attempt.kv_received``: vLLM's decode instance computes
   that one for the logits), which yields the client's first token; it decodes there and
   holds its KV there. Its TTFT therefore counts the prefill, the transfer and the decode
   instance's queue.

The pair is in one DC (a policy that names a prefill row of another DC is a bug:
``ValueError``). The client may give up in any leg: the prefill leg is aborted where it is, a
transfer in flight is dropped on arrival. A prefill leg that fails (its DC went down, its
replica stopped) fails the client's attempt, which the client retries as any failed attempt.
The decode instance reserves nothing while the KV is in flight (vLLM allocates the decode
side's blocks when it schedules the request).
"""

from __future__ import annotations

from abc import abstractmethod

from agents.policy.types import Outcome, PrefillDone
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.engine.instance import Instance

BITS_PER_BYTE = 8


class KvLinks:
    """Each DC's prefill-to-decode link, first come first served: a transfer of ``b`` bytes
    that is ready at t ends at ``max(t, free) + 8·b / (gbps·1e9)`` and the link is busy until
    then (``free``)."""

    def __init__(self, fleet: FleetSpec) -> None:
        self._gbps = dict(fleet.kv_link_gbps)
        self._free_s: dict[str, float] = {}
        self.transfers = 0
        self.bytes_moved = 0.0
        self.waited_s = 0.0  # summed over transfers: time spent queued behind others

    def transfer(self, dc: str, size_bytes: float, ready_s: float) -> float:
        """When a transfer of ``size_bytes`` ready at ``ready_s`` over ``dc``'s link ends."""
        gbps = self._gbps.get(dc, 0.0)
        if gbps <= 0:
            raise ValueError(f"data centre {dc!r} has no kv_link_gbps: it cannot move a KV cache")
        start = max(ready_s, self._free_s.get(dc, ready_s))
        end = start + BITS_PER_BYTE * size_bytes / (gbps * 1e9)
        self._free_s[dc] = end
        self.transfers += 1
        self.bytes_moved += size_bytes
        self.waited_s += start - ready_s
        return end

    def figures(self) -> dict[str, float]:
        """``kv_transfers``, ``kv_gb_moved`` and ``kv_transfer_wait_s`` (mean queueing)."""
        return {
            "kv_transfers": self.transfers,
            "kv_gb_moved": self.bytes_moved / 1e9,
            "kv_transfer_wait_s": self.waited_s / self.transfers if self.transfers else 0.0,
        }


class PairedLegs:
    """The loop's part of disaggregation (module docstring): the runner sends a pair's prefill
    leg (``_send_pair``), reports a leg's end here (``_prefilled``), and drops a leg whose
    client gave up (``_drop_leg``); it provides the hooks below."""

    fleet: FleetSpec
    instances: list[Instance]
    links: KvLinks
    _pairs: dict[Attempt, tuple[Attempt, int, Instance]]  # client -> (leg, decode index, engine)

    def _send_pair(self, attempt: Attempt, outcome: Outcome, index: int, now: float) -> None:
        """Send the prefill leg of ``attempt``, to decode on instance ``index`` afterwards."""
        prefill_index = self._index_of_row(outcome.prefill_instance)
        prefill, decode = self.fleet.instances[prefill_index], self.fleet.instances[index]
        if prefill.dc != decode.dc:
            raise ValueError(f"a pair spans two data centres ({prefill.dc}, {decode.dc})")
        leg = Attempt(attempt.request, attempt.attempt, attempt.arrival_s, 1, client=attempt)
        leg.return_s = attempt.return_s
        self._pairs[attempt] = (leg, index, self.instances[index])
        self._dispatch(leg, prefill_index, now)

    def _prefilled(self, leg: Attempt, now: float) -> None:
        """The prefill leg ended at ``now``: its KV cache leaves for the decode instance (ok),
        or its client's attempt fails with it (failed), or nothing (the client gave up)."""
        client = leg.client
        assert client is not None and leg.instance is not None
        _, index, decode = self._pairs.pop(client)
        client.busy_s += leg.busy_s
        if client.status != "pending":
            return
        if leg.status == "failed":
            self._fail(client, now)
            return
        if leg.status != "ok":
            return
        client.admitted_s, client.cached_tokens = leg.admitted_s, leg.cached_tokens
        iid = leg.instance.spec.instance_id
        ttft_s = now + leg.return_s - leg.arrival_s
        self._observe(PrefillDone(leg.request.request_id, leg.attempt, iid, ttft_s, now + leg.return_s))
        decided = self.fleet.instances[index]
        bound = self._index_of_id(self._bind_decode(client, decided.instance_id, now))
        if bound != index:
            if self.fleet.instances[bound].dc != decided.dc:
                raise ValueError(f"a decode side bound in another data centre ({decided.dc})")
            index, decode = bound, self.instances[bound]
        request = leg.request
        matched = decode.cache.match(request.block_hashes)
        resident = min(request.reusable_tokens(matched), request.input_tokens - 1)
        size = leg.instance.profile.kv_bytes_per_token * (request.input_tokens - resident)
        ends = self.links.transfer(leg.instance.spec.dc, size, now)
        self._at_transferred(ends, (client, index, decode))

    def _transferred(self, client: Attempt, index: int, decode: Instance, now: float) -> None:
        """The KV cache reached the decode instance: the client's attempt joins it there."""
        client.kv_received = True
        self._reach(client, index, decode, now)

    def _drop_leg(self, client: Attempt, now: float) -> None:
        """``client`` was given up on: abort its prefill leg where it is (nothing if none)."""
        pair = self._pairs.get(client)
        if pair is None or pair[0].status != "pending":
            return  # (in transfer: dropped when it arrives, its client's attempt ended)
        leg = pair[0]
        if leg.instance is None:  # on its way to the prefill instance: dropped there
            del self._pairs[client]
            leg.status = "aborted"
        else:
            self._abort_on(leg, leg.instance, now)

    @abstractmethod
    def _index_of_row(self, row: int) -> int:
        """The instance index of row ``row`` of the view the scheduler decided on."""

    @abstractmethod
    def _index_of_id(self, instance_id: str) -> int:
        """The instance index of ``instance_id``."""

    @abstractmethod
    def _bind_decode(self, client: Attempt, decided_id: str, now: float) -> str:
        """Where the scheduler has ``client`` decode, now that its KV is ready to move."""

    @abstractmethod
    def _dispatch(self, attempt: Attempt, index: int, now: float) -> None:
        """Send ``attempt`` to instance ``index`` (it arrives r/2 later)."""

    @abstractmethod
    def _reach(self, attempt: Attempt, index: int, instance: Instance, now: float) -> None: ...

    @abstractmethod
    def _fail(self, attempt: Attempt, now: float) -> None: ...

    @abstractmethod
    def _abort_on(self, attempt: Attempt, instance: Instance, now: float) -> None: ...

    @abstractmethod
    def _observe(self, event: PrefillDone) -> None:
        """Tell the scheduler."""

    @abstractmethod
    def _at_transferred(self, time_s: float, payload: tuple[Attempt, int, Instance]) -> None:
        """Call ``_transferred(*payload, time_s)`` at ``time_s``."""
