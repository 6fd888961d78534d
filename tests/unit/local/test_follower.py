"""The plan follower of ``tokenfleet up --planner`` (``local/follower.py``), driven by the
``ReplicaPlan`` and ``Heartbeat`` events a planner and a dispatcher publish, against fake server
slots: servers start up to the slots, drain (out of the dispatcher's inventory) and stop only
once their heartbeats said them idle past the grace; a draining server is taken back before a
standby one starts; stray, older and clamped plans; the prefill-only servers a plan asks for,
started in that role and listed in it, drained first when too many, kept when a plan names none,
ignored without a KV connector."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from local.follower import ACTIVE, Follower
from local.scaling import Scaling
from schemas.events import Heartbeat, ReplicaPlan, Role

SERVERS = ["e-0", "e-1", "e-2"]
GRACE_S = 2.0


def scaling() -> Scaling:
    return Scaling(
        planner="hpa", model="m", version="1", dc="dc-1", servers=list(SERVERS), initial=1,
        inventory="", engines_file="", fleet_file="", profile="llama3-8b-h100", gpus_per_server=1,
        load_s=3.0, heartbeat_s=0.25, drain_grace_s=GRACE_S,
    )  # fmt: skip


class FakeServers:
    """The supervisor's side: states, what was done, and what each engine's /metrics would say."""

    def __init__(self) -> None:
        self.states = {"e-0": "ready", "e-1": "standby", "e-2": "standby"}
        self.published: list[list[str]] = []
        self.listed_roles: dict[str, Role] = {}  # the newest inventory's
        self.started: list[str] = []
        self.started_as: dict[str, Role] = {}
        self.stopped: list[str] = []
        self.exited: set[str] = set()
        self.running_on_engine: set[str] = set()

    def state(self, name: str) -> str:
        return self.states[name]

    def start(self, name: str, role: Role) -> None:
        assert self.states[name] == "standby"
        self.started.append(name)
        self.started_as[name] = role
        self.states[name] = "loading"

    def mark(self, name: str, state: str, detail: str) -> None:
        self.states[name] = state

    def stop(self, name: str) -> None:
        assert self.states[name] == "draining"
        self.stopped.append(name)
        self.states[name] = "stopping"

    def gone(self, name: str) -> bool:
        return name in self.exited

    def busy(self, name: str) -> bool:
        return name in self.running_on_engine

    def publish(self, active: Mapping[str, Role]) -> None:
        self.published.append(list(active))
        self.listed_roles = dict(active)


def plan(
    replicas: int,
    ts: float,
    model: str = "m",
    dc: str = "dc-1",
    version: str = "1",
    prefill: int | None = None,
) -> ReplicaPlan:
    return ReplicaPlan(
        ts=ts, planner="hpa", model=model, model_version=version, dc=dc, replicas=replicas, reason="r",
        prefill_replicas=prefill,
    )  # fmt: skip


def beat(name: str, ts: float, *, draining: bool = False, running: int = 0, tokens: int = 0) -> Heartbeat:
    return Heartbeat(
        ts=ts, instance_id=name, dc="dc-1", model="m", model_version="1", waiting=0, running=running,
        tokens_in_flight=tokens, kv_blocks_used=0, kv_blocks_total=10, endpoint_ready=True,
        draining=draining,
    )  # fmt: skip


@pytest.fixture
def servers() -> FakeServers:
    return FakeServers()


@pytest.fixture
def follower(servers: FakeServers) -> Follower:
    return Follower(scaling(), servers, lambda line: None)


def test_without_a_plan_the_servers_stay_as_they_started(follower: Follower, servers: FakeServers) -> None:
    follower.observe(beat("e-0", 1.0, running=5))
    follower.step(2.0)
    assert servers.started == [] and servers.published == [] and follower.active() == ["e-0"]


def test_more_replicas_start_standby_slots_in_order_up_to_the_slots(
    follower: Follower, servers: FakeServers
) -> None:
    follower.observe(plan(2, ts=1.0))
    follower.step(1.0)
    assert servers.started == ["e-1"] and servers.published == [["e-0", "e-1"]]
    follower.step(1.5)  # converged: nothing more
    assert servers.started == ["e-1"] and len(servers.published) == 1
    follower.observe(plan(9, ts=2.0))  # more than the slots: all of them
    follower.step(2.0)
    assert follower.desired == 3 and servers.started == ["e-1", "e-2"]
    assert servers.published[-1] == ["e-0", "e-1", "e-2"]
    assert {servers.states[n] for n in SERVERS} <= set(ACTIVE)


def test_plans_for_another_pool_or_older_ones_are_not_followed(
    follower: Follower, servers: FakeServers
) -> None:
    follower.observe(plan(3, ts=5.0, model="other"))
    follower.observe(plan(3, ts=5.0, dc="dc-2"))
    follower.observe(plan(3, ts=5.0, version="2"))
    assert follower.desired is None
    follower.observe(plan(2, ts=5.0, version=""))  # a plan naming no version is the model's
    follower.observe(plan(3, ts=4.0))  # read late: the newer one stands
    assert follower.desired == 2
    follower.observe(plan(0, ts=6.0))  # never below the floor: the gateway keeps an engine
    assert follower.desired == 1


def test_fewer_replicas_drain_the_least_busy_and_stop_it_only_once_idle_past_the_grace(
    follower: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "ready", "e-2": "ready"})
    follower.observe(beat("e-0", 9.0, running=6))
    follower.observe(beat("e-1", 9.0, running=4))
    follower.observe(beat("e-2", 9.0, running=2))
    follower.observe(plan(2, ts=9.5))
    follower.step(10.0)
    assert servers.states["e-2"] == "draining" and servers.published == [["e-0", "e-1"]]

    follower.observe(beat("e-2", 9.9, running=0))  # from before the drain: says nothing
    follower.observe(beat("e-2", 10.1, running=0))  # the dispatcher has not read its file yet
    follower.step(13.0)
    assert servers.stopped == []
    follower.observe(beat("e-2", 10.5, draining=True, running=2))  # finishing what it runs
    follower.observe(beat("e-2", 11.0, draining=True, running=0))
    follower.observe(beat("e-2", 12.0, draining=True, tokens=30))  # a call decided before is open
    follower.observe(beat("e-2", 12.5, draining=True))
    follower.step(14.0)  # idle since 12.5: not past the grace yet
    assert servers.stopped == []
    follower.observe(beat("e-2", 14.4, draining=True))
    follower.step(14.5)
    assert servers.stopped == ["e-2"] and servers.states["e-2"] == "stopping"
    follower.step(15.0)  # its process still runs
    assert servers.states["e-2"] == "stopping"
    servers.exited.add("e-2")
    follower.step(15.5)
    assert servers.states["e-2"] == "standby" and follower.drains == {}
    assert follower.active() == ["e-0", "e-1"]


def test_a_server_not_ready_yet_is_taken_out_before_a_ready_one(
    follower: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "loading"})
    follower.observe(beat("e-0", 1.0, running=9))
    follower.observe(plan(1, ts=1.0))
    follower.step(1.0)
    assert servers.states == {"e-0": "ready", "e-1": "draining", "e-2": "standby"}


def test_a_draining_server_is_taken_back_before_a_standby_one_starts(
    follower: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "ready"})
    follower.observe(plan(1, ts=1.0))
    follower.step(1.0)
    assert servers.states["e-1"] == "draining"
    follower.observe(plan(3, ts=2.0))
    follower.step(2.0)
    assert servers.states["e-1"] == "ready" and servers.started == ["e-2"] and follower.drains == {}
    assert servers.published[-1] == ["e-0", "e-1", "e-2"]


def test_without_heartbeats_the_engine_itself_says_whether_it_still_runs_something(
    follower: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "ready"})
    follower.observe(plan(1, ts=1.0))
    follower.step(1.0)
    servers.running_on_engine.add("e-1")  # the dispatcher forgot it: no heartbeat comes
    follower.step(1.0 + GRACE_S + 0.1)
    follower.step(1.0 + 3 * GRACE_S)
    assert servers.stopped == []
    servers.running_on_engine.clear()
    follower.step(1.0 + 3 * GRACE_S + 0.1)  # idle from here
    follower.step(1.0 + 4 * GRACE_S)
    assert servers.stopped == []
    follower.step(1.0 + 4 * GRACE_S + 0.2)
    assert servers.stopped == ["e-1"]


def test_a_server_that_exits_while_draining_is_standby_again(
    follower: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "ready"})
    follower.observe(plan(1, ts=1.0))
    follower.step(1.0)
    servers.exited.add("e-1")
    follower.step(1.5)
    assert servers.states["e-1"] == "standby" and servers.stopped == [] and follower.drains == {}


# -- roles ---------------------------------------------------------------------------------------


@pytest.fixture
def said() -> list[str]:
    return []


@pytest.fixture
def pd(servers: FakeServers, said: list[str]) -> Follower:
    """A follower of a stack whose servers have a KV connector."""
    return Follower(scaling(), servers, said.append, kv_connector=True)


def test_a_plan_with_one_prefill_replica_of_three_starts_one_server_as_prefill(
    pd: Follower, servers: FakeServers, said: list[str]
) -> None:
    pd.observe(plan(3, ts=1.0, prefill=1))
    pd.step(1.0)
    assert servers.started == ["e-1", "e-2"]
    assert sorted(servers.started_as.values()) == ["both", "prefill"]  # e-0 runs both already
    assert servers.listed_roles == {"e-0": "both", **servers.started_as}
    assert pd.targets() == {"prefill": 1, "both": 2} and "1 prefill only" in said[-1]
    pd.step(1.5)  # converged: nothing more
    assert len(servers.published) == 1


def test_fewer_prefill_replicas_drain_a_prefill_server_and_none_keeps_them(
    pd: Follower, servers: FakeServers
) -> None:
    pd.observe(plan(3, ts=1.0, prefill=1))
    pd.step(1.0)
    (prefill,) = [n for n, role in servers.started_as.items() if role == "prefill"]
    servers.states.update({"e-1": "ready", "e-2": "ready"})
    pd.observe(plan(3, ts=2.0))  # a plan that names no prefill count: the one running stays
    pd.step(2.0)
    assert pd.targets() == {"prefill": 1, "both": 2} and len(servers.published) == 1
    pd.observe(plan(2, ts=3.0))  # smaller, still none named: a both server drains
    pd.step(3.0)
    (drained,) = [n for n in SERVERS if servers.states[n] == "draining"]
    assert drained != prefill and servers.listed_roles[prefill] == "prefill"
    pd.observe(plan(2, ts=4.0, prefill=0))  # no prefill server wanted: the prefill one drains
    pd.step(4.0)
    assert servers.states[prefill] == "draining"
    assert servers.states[drained] == "ready"  # the both server draining is taken back instead
    assert servers.listed_roles == {"e-0": "both", drained: "both"}


def test_a_role_is_given_at_start_a_draining_server_is_taken_back_only_into_its_own(
    pd: Follower, servers: FakeServers
) -> None:
    servers.states.update({"e-1": "ready", "e-2": "ready"})  # three both servers run
    pd.observe(plan(3, ts=1.0, prefill=1))
    pd.step(1.0)  # a both server drains; no standby slot for the prefill one yet
    (drained,) = [n for n in SERVERS if servers.states[n] == "draining"]
    assert servers.started == [] and pd.targets() == {"prefill": 1, "both": 2}
    pd.step(1.5)  # still waiting for the slot: the draining both server is not taken back
    assert servers.states[drained] == "draining" and servers.started == []
    servers.exited.add(drained)
    pd.step(2.0)  # the slot is standby again: it starts in the role the plan lacks
    pd.step(2.0)
    assert servers.started == [drained] and servers.started_as[drained] == "prefill"
    assert servers.listed_roles[drained] == "prefill"


def test_at_least_one_server_stays_both(pd: Follower, servers: FakeServers) -> None:
    pd.observe(plan(2, ts=1.0, prefill=5))
    pd.step(1.0)
    assert pd.targets() == {"prefill": 1, "both": 1}
    assert servers.started_as == {"e-1": "prefill"}


def test_without_a_connector_prefill_counts_are_ignored_and_said_once(
    servers: FakeServers, said: list[str]
) -> None:
    follower = Follower(scaling(), servers, said.append)
    follower.observe(plan(3, ts=1.0, prefill=1))
    follower.observe(plan(3, ts=2.0, prefill=2))
    follower.step(2.0)
    assert set(servers.started_as.values()) == {"both"} and follower.targets()["prefill"] == 0
    assert sum("ignored" in line for line in said) == 1
    assert "--kv-connector" in next(line for line in said if "ignored" in line)
