"""The router's own in-flight accounting (vectorised) against a plain per-instance reference."""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from agents.policy.common.inflight import InFlight
from agents.policy.common.numeric import blocks_for
from agents.policy.types import ClusterView, Finished, RequestView
from tests.unit.policy.helpers import cluster_view


class _Reference:
    """The previous per-instance Python implementation of ``since_heartbeat``."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.recent: dict[str, deque[tuple[float, int]]] = {}

    def add(self, instance_id: str, tokens: int, now_s: float) -> None:
        self.recent.setdefault(instance_id, deque()).append((now_s, tokens))

    def since_heartbeat(self, view: ClusterView) -> tuple[list[int], list[int]]:
        requests, tokens = [0] * len(view), [0] * len(view)
        for instance_id, recent in self.recent.items():
            row = view.index_of.get(instance_id)
            cutoff = -np.inf if row is None else float(view.last_heartbeat_s[row])
            if recent:
                cutoff = max(cutoff, recent[-1][0] - self.max_age_s)
            while recent and recent[0][0] <= cutoff:
                recent.popleft()
            if row is not None:
                requests[row], tokens[row] = len(recent), sum(t for _, t in recent)
        return requests, tokens


def _view(ids: list[str], heartbeats: list[float]) -> ClusterView:
    return cluster_view(len(ids), ids=ids, heartbeats=heartbeats, kv_total=100)


def _request(k: int, tokens: int) -> RequestView:
    return RequestView(f"r{k}", 1, "t", "m", "interactive", tokens, 16, (), 0.0)


def test_since_heartbeat_and_counts_match_the_reference() -> None:
    rng = random.Random(5)
    flight, reference = InFlight(max_age_s=3.0), _Reference(3.0)
    instances = [f"i{k}" for k in range(40)]
    heartbeat = dict.fromkeys(instances, 0.0)
    open_requests: list[tuple[RequestView, str]] = []
    now = 0.0
    view = _view(instances, [0.0] * 40)
    for k in range(1500):
        now += rng.random() * 0.02
        roll = rng.random()
        if roll < 0.05:  # a new snapshot: some instances reported, some did not, order shuffled
            for instance_id in instances:
                if rng.random() < 0.7 and instance_id != "i0":  # i0 stopped reporting
                    heartbeat[instance_id] = now - rng.random() * 0.01
            shown = [i for i in instances if rng.random() < 0.9]
            rng.shuffle(shown)
            view = _view(shown, [heartbeat[i] for i in shown])
        elif roll < 0.75:
            instance_id = rng.choice(instances)
            request = _request(k, rng.randint(1, 5000))
            flight.add(request, instance_id, now)
            reference.add(instance_id, request.input_tokens, now)
            open_requests.append((request, instance_id))
        elif open_requests:
            request, instance_id = open_requests.pop(rng.randrange(len(open_requests)))
            flight.complete(Finished(request.request_id, 1, instance_id, "ok", 1, 0, 1, 0.1, 0.01, now))
        requests, tokens = flight.since_heartbeat(view)
        expected = reference.since_heartbeat(view)
        assert (requests.tolist(), tokens.tolist()) == expected, k
        load = flight.per_instance(flight.requests, view)
        blocks = flight.per_instance(flight.blocks, view)
        for row, instance_id in enumerate(view.instance_ids):
            mine = [r for r, i in open_requests if i == instance_id]
            assert load[row] == len(mine)
            assert blocks[row] == sum(blocks_for(r.input_tokens) for r in mine)
    other = {"i3": 7, "nowhere": 1}
    assert flight.per_instance(other, view).tolist() == [7 if i == "i3" else 0 for i in view.instance_ids]


def test_since_heartbeat_answers_are_read_only_and_follow_each_send() -> None:
    # Within one snapshot the answer is kept and only the rows sent to are redone: it must
    # still change with every send, and callers cannot write into the kept arrays.
    flight = InFlight(max_age_s=30.0)
    view = _view(["a", "b", "c"], [1.0, 1.0, 1.0])
    for k, (instance_id, tokens) in enumerate([("b", 100), ("b", 50), ("c", 7), ("zz", 9)]):
        flight.add(_request(k, tokens), instance_id, 2.0 + k)
    requests, tokens = flight.since_heartbeat(view)
    assert (requests.tolist(), tokens.tolist()) == ([0, 2, 1], [0, 150, 7])
    flight.add(_request(9, 1000), "a", 9.0)
    requests, tokens = flight.since_heartbeat(view)
    assert (requests.tolist(), tokens.tolist()) == ([1, 2, 1], [1000, 150, 7])
    try:
        requests[0] = 5
    except ValueError:
        pass
    else:
        raise AssertionError("since_heartbeat's arrays must be read-only")
    # A send older than the row's heartbeat is not added; a newer heartbeat drops what it shows.
    flight.add(_request(10, 3), "a", 0.5)
    assert flight.since_heartbeat(view)[0].tolist() == [1, 2, 1]
    later = _view(["a", "b", "c"], [9.5, 3.0, 1.0])
    assert flight.since_heartbeat(later)[1].tolist() == [0, 0, 7]


def test_a_placement_read_late_is_forgotten_by_the_heartbeat_that_postdates_it() -> None:
    # Another decider's send (made at 0.5, read after an own send at 1.0) joins in time order,
    # so a heartbeat at 0.7 forgets it and keeps the own send.
    flight = InFlight()
    flight.add(_request(1, 100), "a", 1.0)
    flight.add(_request(2, 300), "a", 0.5)
    requests, tokens = flight.since_heartbeat(_view(["a"], [0.7]))
    assert (requests.tolist(), tokens.tolist()) == ([1], [100])
    assert flight.requests == {"a": 2}  # both are in flight until they finish
