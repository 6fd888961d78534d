"""Prefill/decode disaggregation in the simulator: a pair's three legs against their formulas,
the link's queue, give-ups and failures in any leg, and the fleet file's roles and links."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agents.policy.common.selector import InstanceSelector
from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.pipeline import Scheduler
from agents.policy.types import BoolArray, ClusterView, Observation, Placement, PrefillDone, RequestView
from sim.engine.fleet import FleetSpec, InstanceSpec, Outage, parse_fleet
from sim.loop.config import SimConfig
from sim.loop.results import RunResult
from sim.loop.runner import Simulation, simulate
from tests.unit.sim.helpers import LLAMA, request, workload

pytestmark = pytest.mark.unit

GBPS = 100.0


def pd_fleet(prefill: int = 1, decode: int = 1, gbps: float = GBPS) -> FleetSpec:
    specs = [InstanceSpec(f"p{i}", "A", "llama3-8b", "1", LLAMA, role="prefill") for i in range(prefill)]
    specs += [InstanceSpec(f"d{i}", "A", "llama3-8b", "1", LLAMA, role="decode") for i in range(decode)]
    return FleetSpec("pd", tuple(specs), kv_link_gbps={"A": gbps})


class AlwaysPair(InstanceSelector):
    """Decode on the first candidate, prefill on the next prefill row free of this batch's
    pairs (round robin): the mechanics alone, no policy."""

    name = "always-pair"

    def __init__(self) -> None:
        super().__init__(0)
        self.turn = 0
        self.seen: list[Observation] = []

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        prefill = np.flatnonzero(view.prefill_rows(request))
        self.turn += 1
        return Placement(int(np.flatnonzero(mask)[0]), "pair", None, int(prefill[self.turn % len(prefill)]))

    def observe(self, event: Observation) -> None:
        super().observe(event)
        self.seen.append(event)


def run(fleet: FleetSpec, *requests, config: SimConfig | None = None) -> tuple[RunResult, AlwaysPair]:  # type: ignore[no-untyped-def]
    selector = AlwaysPair()
    scheduler = Scheduler(selector.name, PassThrough(), HomeDc(), selector)
    return Simulation(workload(*requests), fleet, scheduler, config or SimConfig()).run(), selector


def prefill_s(new: int, cached: int = 0) -> float:
    return LLAMA.t0_s + LLAMA.prefill_chunk_s(new, cached)


def transfer_s(tokens: int) -> float:
    return 8 * LLAMA.kv_bytes_per_token * tokens / (GBPS * 1e9)


def test_a_pair_prefills_moves_the_kv_and_decodes_its_first_token_after_the_transfer() -> None:
    # (a second, short request later: the window over which busy time counts)
    result, selector = run(pd_fleet(), request("a", 0.0, 6000, 10), request("z", 10.0, 100, 1))
    a, z = result.attempts
    assert a.status == "ok" and a.generated == 10
    assert a.instance is not None and a.instance.spec.instance_id == "d0"
    assert a.kv_received and a.cached_tokens == 0
    # decode leg: the last prompt token, computed on top of the 5 999 received
    first = prefill_s(6000) + transfer_s(6000) + prefill_s(1, 5999)
    assert a.first_token_s == pytest.approx(first, rel=1e-12)
    assert result.kv_links["kv_transfers"] == 2
    assert result.kv_links["kv_gb_moved"] == pytest.approx(LLAMA.kv_bytes_per_token * 6100 / 1e9)
    assert result.busy_s[0] == pytest.approx(prefill_s(6000), rel=1e-9)  # p0 prefilled it (z: at 10 s)
    assert a.busy_s + z.busy_s == pytest.approx(sum(result.busy_s), rel=1e-9)  # both legs count
    assert a.busy_s > result.busy_s[0]
    done = [e for e in selector.seen if isinstance(e, PrefillDone) and e.request_id == "a"]
    assert [(e.instance_id, e.ttft_s) for e in done] == [("p0", pytest.approx(prefill_s(6000)))]


def test_both_sides_keep_the_prefix_and_the_link_moves_only_what_the_decode_side_lacks() -> None:
    shared = list(range(8))
    result, _ = run(
        pd_fleet(), request("a", 0.0, 4096 + 600, 2, shared), request("b", 5.0, 4096 + 600, 2, shared)
    )
    b = next(x for x in result.attempts if x.request.request_id == "b")
    assert b.cached_tokens == 4096  # its prefill leg reused a's blocks on p0
    # and only what d0 lacks moves: a's prompt whole, of b's the part after the shared prefix
    moved_tokens = (4096 + 600) + 600
    assert result.kv_links["kv_gb_moved"] == pytest.approx(LLAMA.kv_bytes_per_token * moved_tokens / 1e9)


def test_transfers_ready_together_queue_on_the_link() -> None:
    result, _ = run(pd_fleet(prefill=2), request("a", 0.0, 6000, 2), request("b", 0.0, 6000, 2))
    a, b = sorted(result.attempts, key=lambda x: x.first_token_s or 0)
    assert b.first_token_s - a.first_token_s == pytest.approx(transfer_s(6000), rel=1e-6)
    assert result.kv_links["kv_transfer_wait_s"] == pytest.approx(transfer_s(6000) / 2, rel=1e-6)


def test_a_client_giving_up_during_the_prefill_stops_the_leg_there() -> None:
    classes = dict(DEFAULT_SLO_CLASSES)
    classes["interactive"] = replace(classes["interactive"], client_timeout_s=0.2)
    config = SimConfig(slo_classes=classes, retry_share=0.0)
    result, selector = run(pd_fleet(), request("a", 0.0, 60_000, 5, slo_class="interactive"), config=config)
    (a,) = result.attempts
    assert a.status == "aborted" and a.first_token_s is None
    assert result.kv_links["kv_transfers"] == 0
    assert result.busy_s[0] < prefill_s(60_000)  # stopped at the step in progress
    assert not any(isinstance(e, PrefillDone) for e in selector.seen)


def test_a_prefill_lost_with_its_dc_fails_the_attempt_and_the_client_retries() -> None:
    fleet = replace(pd_fleet(), outages=(Outage("A", 0.05, 10.0),))
    result, selector = run(fleet, request("a", 0.0, 20_000, 3))
    # each retry, at once, fails too (the DC is still down): the client's tries, no more
    assert [(x.attempt, x.status) for x in result.attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert result.kv_links["kv_transfers"] == 0
    assert not any(isinstance(e, PrefillDone) for e in selector.seen)


def test_policies_that_do_not_disaggregate_never_use_a_prefill_instance() -> None:
    result = simulate(workload(request("a", 0.0, 3000, 4)), pd_fleet(), "round-robin", SimConfig())
    (a,) = result.attempts
    assert a.status == "ok" and not a.kv_received and result.busy_s[0] == 0


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_fleet_file_roles_and_links(tmp_path: Path) -> None:
    fleet = parse_fleet(
        write(
            tmp_path,
            "data_centres:\n  - name: A\n    kv_link_gbps: 400\n    instances:\n"
            "      - {count: 1, profile: llama3-8b-h100, role: prefill}\n"
            "      - {count: 2, profile: llama3-8b-h100, role: decode}\n",
        )
    )
    assert [s.role for s in fleet.instances] == ["prefill", "decode", "decode"]
    assert fleet.kv_link_gbps == {"A": 400.0}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    instances:\n      - {profile: llama3-8b-h100, role: prefill}\n"
         "      - {profile: llama3-8b-h100}\n", "needs the DC's kv_link_gbps"),
        ("    kv_link_gbps: 10\n    instances:\n      - {profile: llama3-8b-h100, role: prefil}\n",
         "role must be one of"),
        ("    kv_link_gbps: 0\n    instances:\n      - {profile: llama3-8b-h100}\n", "kv_link_gbps must be"),
        ("    kv_link_gbps: 10\n    instances:\n      - {profile: llama3-8b-h100, role: prefill}\n",
         "only prefill instances"),
    ],
)  # fmt: skip
def test_fleet_file_rejects_bad_roles_and_links(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fleet(write(tmp_path, "data_centres:\n  - name: A\n" + body))
