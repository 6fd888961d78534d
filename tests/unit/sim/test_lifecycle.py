"""Every request ends exactly once; clients time out and retry the same way under every policy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from agents.policy import Scheduler, build_scheduler
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.registry import INSTANCE_SELECTION
from agents.policy.types import (
    BlocksChanged,
    BoolArray,
    ClusterView,
    Finished,
    FirstToken,
    Observation,
    Placement,
    RequestView,
)
from sim.loop.config import SimConfig
from sim.loop.runner import Simulation
from sim.workloads.sources import open_workload
from sim.workloads.trace import Workload
from tests.unit.sim.helpers import fleet_of, request, workload


class Recording:
    """An instance-selection stage that wraps a router and records everything it is shown."""

    def __init__(self, name: str) -> None:
        self.inner = INSTANCE_SELECTION[name](seed=1)
        self.name = name
        self.wants_kv_events = self.inner.wants_kv_events
        self.completions: list[Finished] = []
        self.first_tokens: list[FirstToken] = []
        self.kv_events: list[BlocksChanged] = []
        self.seen: list[RequestView] = []
        self.batches: list[list[str]] = []

    def place(
        self,
        requests: Sequence[RequestView],
        candidates: Sequence[BoolArray],
        view: ClusterView,
        now_s: float,
    ) -> list[Placement]:
        self.seen.extend(requests)
        self.batches.append([r.request_id for r in requests])
        placements: list[Placement] = self.inner.place(requests, candidates, view, now_s)
        return placements

    def observe(self, event: Observation) -> None:
        if isinstance(event, Finished):
            self.completions.append(event)
        elif isinstance(event, FirstToken):
            self.first_tokens.append(event)
        else:
            self.kv_events.append(event)
        self.inner.observe(event)

    def scheduler(self) -> Scheduler:
        return Scheduler(self.name, PassThrough(), HomeDc(), self)


def overloaded() -> Workload:
    """A synthetic mix pushed hard onto two instances: timeouts, retries and batch deadlines."""
    return open_workload("synthetic:duration_s=240,rate_per_s=9,batch_jobs_per_hour=40", seed=3)


@pytest.mark.parametrize("name", ["least-tokens", "dynamo-kv"])
def test_every_attempt_ends_exactly_once(name: str) -> None:
    policy = Recording(name)
    result = Simulation(overloaded(), fleet_of(2), policy.scheduler(), SimConfig(seed=3)).run()
    statuses = Counter(a.status for a in result.attempts)
    assert set(statuses) <= {"ok", "aborted", "rejected"}
    assert statuses["ok"] and statuses["aborted"], statuses  # the scenario really overloads
    for a in result.attempts:
        assert a.end_s is not None and a.end_s >= a.arrival_s
        if a.status == "ok":
            assert a.generated == a.target_tokens == min(a.request.output_tokens, a.output_budget)
    # The router is told about every routed attempt's end exactly once.
    routed = {(a.request.request_id, a.attempt) for a in result.attempts if a.instance is not None}
    told = Counter((c.request_id, c.attempt) for c in policy.completions)
    assert set(told) == routed and max(told.values()) == 1
    # It never saw a request twice under the same attempt number, nor any attempt it was not sent.
    assert len({(r.request_id, r.attempt) for r in policy.seen}) == len(result.attempts)
    if policy.wants_kv_events:
        assert policy.kv_events
    # A first token is seen once per attempt that produced one, before that attempt's end.
    started = Counter((f.request_id, f.attempt) for f in policy.first_tokens)
    assert max(started.values()) == 1
    assert set(started) == {(a.request.request_id, a.attempt) for a in result.attempts if a.first_token_s}


def test_retry_is_a_new_attempt_of_the_same_request() -> None:
    result = Simulation(overloaded(), fleet_of(2), build_scheduler("least-tokens"), SimConfig(seed=3)).run()
    by_id: dict[str, list[int]] = {}
    for a in result.attempts:
        by_id.setdefault(a.request.request_id, []).append(a.attempt)
    retried = {rid: tries for rid, tries in by_id.items() if len(tries) > 1}
    assert retried, "the overloaded scenario must produce retries"
    first_attempts = {(a.request.request_id, a.attempt): a for a in result.attempts}
    for rid, tries in retried.items():
        assert sorted(tries) == [1, 2]  # retried once at most
        first = first_attempts[(rid, 1)]
        assert first.status == "aborted" and first.request.slo_class == "interactive"
        assert first_attempts[(rid, 2)].arrival_s >= first.arrival_s + 10.0  # gave up after 10 s


def test_retry_choice_is_the_same_under_every_policy() -> None:
    config = SimConfig(seed=3, retry_share=0.5)
    chosen = [config.clients().retried(f"r{i}") for i in range(2000)]
    assert 0.45 < sum(chosen) / len(chosen) < 0.55
    assert chosen == [SimConfig(seed=3).clients().retried(f"r{i}") for i in range(2000)]


def test_interactive_client_gives_up_without_first_token_in_10s() -> None:
    # A long prefill takes the whole prefill budget of every step (FCFS chunks, as in vLLM), so a
    # small interactive request admitted beside it gets no first token for > 10 s: its client
    # gives up, and the abort lands at the end of the step in progress.
    reqs = [request("big", 0.0, 120_000, 1, slo_class="long_context"), request("small", 0.01, 100, 5)]
    config = SimConfig(retry_share=0.0)
    result = Simulation(workload(*reqs), fleet_of(1), build_scheduler("round-robin"), config).run()
    small = next(a for a in result.attempts if a.request.request_id == "small")
    big = next(a for a in result.attempts if a.request.request_id == "big")
    assert big.status == "ok" and big.first_token_s is not None and big.first_token_s > 10.01
    assert small.status == "aborted" and small.first_token_s is None
    assert small.end_s is not None and 10.01 <= small.end_s < 10.01 + 1.0
    assert len(result.attempts) == 2  # retry_share 0: nobody retried


def test_batch_request_is_aborted_at_its_deadline() -> None:
    reqs = [request("job", 0.0, 2000, 2000, slo_class="batch", deadline_s=1.0)]
    result = Simulation(workload(*reqs), fleet_of(1), build_scheduler("round-robin"), SimConfig()).run()
    (job,) = result.attempts
    assert job.status == "aborted" and job.end_s is not None
    assert 0 < job.generated < 2000  # tokens already generated are wasted


def test_all_policies_route_everything_on_a_small_trace() -> None:
    w = overloaded()
    for name in INSTANCE_SELECTION:
        result = Simulation(w, fleet_of(2), build_scheduler(name), SimConfig(seed=3)).run()
        assert len({a.request.request_id for a in result.attempts}) == len(w.requests), name


def test_request_the_engine_refuses_is_reported_back_to_the_router() -> None:
    policy = INSTANCE_SELECTION["sglang-cache-aware"]()
    too_big = request("huge", 0.0, 430_000, 1, slo_class="long_context")
    scheduler = Scheduler(policy.name, PassThrough(), HomeDc(), policy)
    result = Simulation(workload(too_big), fleet_of(1), scheduler, SimConfig()).run()
    assert result.attempts[0].status == "rejected"
    assert policy.in_flight.requests == {"i0": 0}


def test_arrivals_at_one_instant_reach_the_router_as_one_batch() -> None:
    w = workload(*(request(rid, at, 600, 4) for rid, at in (("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.5))))
    policy = Recording("round-robin")
    Simulation(w, fleet_of(2), policy.scheduler(), SimConfig()).run()
    assert policy.batches == [["a", "b", "c"], ["d"]]
