"""Hot prefixes spread over the deciders (``agents.affinity``)."""

from __future__ import annotations

import pytest

from agents.affinity import SPREAD_MARK, HotPrefixes
from schemas.events import InferenceRequest


def request(rid: str, blocks: tuple[int, ...] = (1, 2, 3, 4, 5)) -> InferenceRequest:
    return InferenceRequest(
        request_id=rid, model="m", input_tokens=5 * 512, output_budget=8, prompt_block_hashes=blocks
    )


def test_a_cold_key_keeps_its_default_affinity() -> None:
    hot = HotPrefixes(hot_rate_per_s=100, spread=4)
    for k in range(50):  # 50 per second: cold
        sent = request(f"r{k}")
        assert hot.place(sent, k / 50) is sent
    assert hot.rate("m/4", 1.0) == pytest.approx(50 * (1 - 2.718281828**-1), rel=0.2)


def test_a_hot_key_is_spread_over_its_sub_keys_by_request_id_and_cools_down() -> None:
    hot = HotPrefixes(hot_rate_per_s=100, spread=4)
    placed = [hot.place(request(f"r{k}"), k / 1000) for k in range(400)]  # 1 000 per second
    default = request("x").affinity_key
    assert {p.affinity_key for p in placed[:100]} == {default}  # (r reaches 100/s after ~105)
    spread = {p.affinity_key for p in placed[200:]}
    assert spread == {f"m/4{SPREAD_MARK}{k}" for k in range(4)}
    again = HotPrefixes(hot_rate_per_s=100, spread=4)
    for k in range(400):
        again.place(request(f"q{k}"), k / 1000)
    assert again.place(request("r300"), 0.4).affinity == placed[300].affinity  # a resend: same sub-key
    assert hot.place(request("late"), 30.0).affinity == ""  # a quiet half minute: cold again
    other = request("o", (9, 8, 7, 6))
    assert hot.place(other, 0.4) is other  # keys are counted apart


def test_a_publishers_own_choice_is_kept_and_bad_settings_are_refused() -> None:
    chosen = request("r").model_copy(update={"affinity": "mine"})
    assert HotPrefixes(hot_rate_per_s=1e-9).place(chosen, 0.0).affinity_key == "m/mine"
    with pytest.raises(ValueError):
        HotPrefixes(spread=0)
