"""An ended attempt gives the ``Completion`` its event would carry: what the store adapter
(``infra.clickhouse.goodput.ClickHouseOutcomes``) writes, without importing the simulator."""

from __future__ import annotations

import pytest

from sim.loop.feedback import EndedAttempt


def ended(status: str) -> EndedAttempt:
    return EndedAttempt(
        time_s=12.5, request_id="r1", attempt=2, tenant="t", model="llama3-8b", instance_id="i0",
        slo_class="interactive", status=status, arrival_s=10.0, ttft_s=0.5, tpot_s=0.05, e2e_s=2.5,
        input_tokens=300, cached_tokens=128, output_tokens=40, deadline_s=None, met=True,
    )  # fmt: skip


def test_the_completion_carries_the_attempts_figures() -> None:
    event = ended("ok").completion()
    assert (event.ts, event.request_id, event.attempt, event.instance_id) == (12.5, "r1", 2, "i0")
    assert (event.arrival_ts, event.ttft_s, event.tpot_s, event.e2e_s) == (10.0, 0.5, 0.05, 2.5)
    assert (event.input_tokens, event.cached_tokens, event.output_tokens) == (300, 128, 40)
    assert (event.status, event.slo_class, event.tenant, event.deadline_ts) == (
        "ok",
        "interactive",
        "t",
        None,
    )


@pytest.mark.parametrize(
    ("status", "wire"), [("timeout", "timeout"), ("aborted", "aborted"), ("lost", "error")]
)
def test_a_status_the_wire_does_not_know_is_an_error(status: str, wire: str) -> None:
    assert ended(status).completion().status == wire
