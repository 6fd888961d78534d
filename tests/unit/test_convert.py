"""First tokens on the wire -> the policy core's observations (``agents.convert.first_token``):
the end of a prefill leg is ``PrefillDone``, any other first token ``FirstToken``."""

from __future__ import annotations

from agents.convert import first_token
from agents.policy.types import FirstToken, PrefillDone
from schemas.codec import decode, encode
from schemas.events import ResponseStarted


def started(instance_id: str, prefill_leg: bool = False) -> ResponseStarted:
    wire = ResponseStarted(
        ts=5.0,
        request_id="r",
        attempt=2,
        instance_id=instance_id,
        model="m",
        ttft_s=0.9,
        prefill_leg=prefill_leg,
    )
    return decode(ResponseStarted, encode(wire))  # as a worker reads it from the topic


def test_the_end_of_a_prefill_leg_is_prefill_done_on_its_prefill_instance() -> None:
    assert first_token(started("p", prefill_leg=True)) == PrefillDone("r", 2, "p", 0.9, 5.0)


def test_a_first_token_is_a_first_token_by_default() -> None:
    assert not ResponseStarted(request_id="r", instance_id="d", model="m", ttft_s=0.9).prefill_leg
    assert first_token(started("d")) == FirstToken("r", 2, "d", 0.9, 5.0)
