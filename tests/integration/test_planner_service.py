"""The planner service (``planner/``) as processes on the session's embedded broker: one active
planner per fleet through the planners' consumer group (a second one waits, and takes over
when the first is killed), restart-safe (a new process rebuilds its planner's history from the
topics), plans on ``tf.plans`` as ``ReplicaPlan`` and on the desired-replicas gauge, a bad
admission dead-lettered once; and the plans and drains in ClickHouse, read by the dashboard's
replicas panel.

The processes run ``planner.main.serve`` with ``WindowPlanner`` (this module run as a script):
a planner whose plan depends on its own history (a model's first arrivals over the last
``WINDOW_S``), so a planner that did not rebuild its history would publish a smaller plan.
Each test has its own app id (the planners' group) and model (the plans' key).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from clickhouse_connect.driver.client import Client
from prometheus_client.parser import text_string_to_metric_families

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.planners.contract import FleetState, Plan, PoolKey
from infra.clickhouse.sink import FeedbackSink
from infra.kafka.broker import free_port
from lab.stack import Collector
from schemas.codec import decode
from schemas.events import DeadLetter, Heartbeat, InferenceRequest, ReplicaPlan
from schemas.topics import ADMISSION, DLQ, PLANS, REQUESTS
from tests.e2e.test_dashboards import expand_macros, load, panels
from tests.integration.streaming import ROOT, publish, unique

INTERVAL_S = 0.5
WINDOW_S = 90.0
TIMEOUT_S = 60.0
GROUP_TIMEOUTS = {  # Tansu holds a join for half the rebalance timeout: low, for a quick takeover
    "TOKENFLEET_BROKER_SESSION_TIMEOUT_S": "4",
    "TOKENFLEET_BROKER_REBALANCE_TIMEOUT_S": "4",
    "TOKENFLEET_BROKER_HEARTBEAT_INTERVAL_S": "0.5",
}


class WindowPlanner:
    """Plans one model: replicas in each home DC = the model's first arrivals from there over the
    last ``WINDOW_S``, from the demand it was shown (its own history)."""

    name = "window"
    interval_s = INTERVAL_S

    def __init__(self, model: str) -> None:
        self.model = model
        self.history: list[tuple[float, PoolKey, int]] = []

    def plan(self, state: FleetState) -> Plan:
        for d in state.demand:
            if d.model == self.model and d.arrivals:
                self.history.append((state.now_s, (d.model, d.version, d.home_dc), d.arrivals))
        self.history = [h for h in self.history if state.now_s - h[0] <= WINDOW_S]
        replicas: dict[PoolKey, int] = {}
        for _, key, arrivals in self.history:
            replicas[key] = replicas.get(key, 0) + arrivals
        return Plan(
            replicas=replicas, reasons={k: f"{n} arrivals in {WINDOW_S:g} s" for k, n in replicas.items()}
        )


def _child(model: str) -> None:
    """A planner process (``python -m tests.integration.test_planner_service MODEL``): its
    settings from the environment, ``WindowPlanner`` planning ``model``."""
    import logging

    from infra.kafka.connection import KafkaConnection
    from infra.settings import read_settings
    from planner.fleet_state import FleetFacts
    from planner.main import serve

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    settings = read_settings()
    connection = KafkaConnection.from_settings(settings)
    asyncio.run(serve(settings, connection, WindowPlanner(model), FleetFacts(), interval_s=INTERVAL_S))


class PlannerProcess:
    """One planner process of app id ``app_id`` and its probes (``/metrics``, ``/ready``)."""

    def __init__(self, bootstrap: str, app_id: str, model: str, data_dir: Path) -> None:
        self.port = free_port()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / f"planner-{self.port}.log"
        env = {
            **os.environ,
            **GROUP_TIMEOUTS,
            "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap,
            "TOKENFLEET_APP_ID": app_id,
            "TOKENFLEET_DATA_DIR": str(data_dir),
            "TOKENFLEET_PLANNER_WEB_PORT": str(self.port),
            "TOKENFLEET_PLANNER_HISTORY_S": "120",
            "TOKENFLEET_PLANNER_KEEPALIVE_INTERVALS": "4",
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.test_planner_service", model],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.worker = f"{socket.gethostname()}:{self.process.pid}"

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/ready")[0] == 200

    def sample(self, name: str, **labels: str) -> float | None:
        status, text = self._get("/metrics")
        if status != 200:
            return None
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return float(s.value)
        return None

    def active(self) -> bool:
        return self.sample("tokenfleet_planner_active") == 1.0

    def desired(self, model: str, dc: str) -> float | None:
        return self.sample("tokenfleet_desired_replicas", pool=model, dc=dc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> int:
        """SIGTERM: it leaves the planners' group and exits; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


async def until(
    what: str, condition: Callable[[], bool], timeout_s: float = TIMEOUT_S, *logs: PlannerProcess
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(p.log()[-3000:] for p in logs)
            raise AssertionError(f"not within {timeout_s:g} s: {what}\n{tails}")
        await asyncio.sleep(0.2)


class Plans(Collector):
    """The plans of ``model`` on ``tf.plans`` from now on, and the dead letters from ``tf.admission``."""

    def __init__(self, bootstrap: str, model: str) -> None:
        super().__init__(bootstrap, [PLANS, DLQ], from_start=False, poll_ms=100)
        self.model = model
        self.plans: list[ReplicaPlan] = []
        self.letters: list[DeadLetter] = []

    def take(self, topic: str, records: list, now: float) -> None:  # type: ignore[override, type-arg]
        for record in records:
            if topic == PLANS.name and record.key == self.model.encode():
                self.plans.append(decode(ReplicaPlan, record.value))
            elif topic == DLQ.name and record.key == ADMISSION.name.encode():
                self.letters.append(decode(DeadLetter, record.value))

    def by(self, worker: str, replicas: int) -> list[ReplicaPlan]:
        return [p for p in self.plans if p.worker == worker and p.replicas == replicas]


def requests(model: str, count: int) -> list[InferenceRequest]:
    return [
        InferenceRequest(request_id=unique("r"), model=model, input_tokens=100, output_budget=10, home_dc="A")
        for _ in range(count)
    ]


def test_one_planner_is_active_a_second_waits_and_takes_over_when_it_is_killed(
    broker: str, tmp_path: Path
) -> None:
    app_id, model = unique("planners"), unique("pm")
    marker = unique("bad-admission")

    async def scenario() -> None:
        first = PlannerProcess(broker, app_id, model, tmp_path / "first")
        second = PlannerProcess(broker, app_id, model, tmp_path / "second")
        both = (first, second)
        try:
            await until("both planners ready", lambda: first.ready() and second.ready(), TIMEOUT_S, *both)
            await until("one planner active", lambda: first.active() or second.active(), TIMEOUT_S, *both)
            await asyncio.sleep(2.0)  # a rebalance may still move the lease once: let it settle
            (active,) = [p for p in both if p.active()]
            (waiting,) = [p for p in both if p is not active]
            plans = Plans(broker, model)
            async with plans:
                await publish(broker, REQUESTS, requests(model, 3))
                bad = json.dumps({"not": "an admission", "marker": marker}).encode()
                await publish(broker, ADMISSION, [(model.encode(), bad)])
                await until("a plan of 3 from the active planner", lambda: bool(plans.by(active.worker, 3)))
                assert not [p for p in plans.plans if p.worker == waiting.worker], (
                    "the waiting planner published"
                )
                (plan, *_) = plans.by(active.worker, 3)
                assert (plan.planner, plan.model_version, plan.dc, plan.reason) == (
                    "window",
                    "",
                    "A",
                    "3 arrivals in 90 s",
                )
                assert active.desired(model, "A") == 3.0
                assert (
                    waiting.desired(model, "A") is None and waiting.sample("tokenfleet_planner_active") == 0.0
                )

                def ours() -> list[DeadLetter]:
                    return [d for d in plans.letters if marker.encode() in base64.b64decode(d.original_b64)]

                await until("the bad admission dead-lettered", lambda: bool(ours()))
                await asyncio.sleep(2 * INTERVAL_S)
                (letter,) = ours()  # once: by the active planner only
                assert letter.reason.startswith("invalid AdmissionDecision")

                active.kill()
                await until("the waiting planner takes over", waiting.active, TIMEOUT_S, waiting)
                assert waiting.desired(model, "A") == 3.0  # the newest plan, read from tf.plans
                await until(
                    "a keep-alive from the new active planner", lambda: bool(plans.by(waiting.worker, 3))
                )
                await publish(broker, REQUESTS, requests(model, 2))
                await until(
                    "a plan of 5 from the new active planner", lambda: bool(plans.by(waiting.worker, 5))
                )
                assert waiting.desired(model, "A") == 5.0
                assert "active (this process holds tf.plans:0" in waiting.log()
                assert "waiting (another planner is active)" in waiting.log()
            assert waiting.stop() == 0
        finally:
            for process in both:
                if process.process.poll() is None:
                    process.kill()

    asyncio.run(scenario())


def test_a_restarted_planner_rebuilds_its_state_from_the_topics(broker: str, tmp_path: Path) -> None:
    app_id, model = unique("planners"), unique("pm")

    async def scenario() -> None:
        first = PlannerProcess(broker, app_id, model, tmp_path / "first")
        later: PlannerProcess | None = None
        try:
            await until("the planner active", lambda: first.ready() and first.active(), TIMEOUT_S, first)
            plans = Plans(broker, model)
            async with plans:
                await publish(broker, REQUESTS, requests(model, 3))
                await until("a plan of 3", lambda: bool(plans.by(first.worker, 3)), TIMEOUT_S, first)
                first.kill()
                later = PlannerProcess(broker, app_id, model, tmp_path / "later")
                await until(
                    "the new planner active", lambda: later.ready() and later.active(), TIMEOUT_S, later
                )
                assert later.desired(model, "A") == 3.0  # its newest plan, read back
                await until("a keep-alive of 3 from the new planner", lambda: bool(plans.by(later.worker, 3)))
                await publish(broker, REQUESTS, requests(model, 1))
                # 3 + 1: the arrivals before the restart are in the planner's history again
                await until("a plan of 4 from the new planner", lambda: bool(plans.by(later.worker, 4)))
                assert not plans.by(later.worker, 1), "the new planner forgot the arrivals before it started"
            assert "state rebuilt from the last 120 s of the topics" in later.log()
            assert later.stop() == 0
        finally:
            for process in (first, later):
                if process is not None and process.process.poll() is None:
                    process.kill()

    asyncio.run(scenario())


def test_plans_and_drains_are_stored_and_the_replicas_panel_shows_them(client: Client) -> None:
    """The rows the store's consumer writes from ``tf.plans`` and ``tf.heartbeats``, read by the
    dashboard's replicas panel: desired, ready and draining replicas, cold and warm starts."""
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES)
    t0 = float(int(time.time() // 60 * 60) - 600)  # a minute's start, ten minutes ago

    def beat(instance: str, ts: float, ready: bool = True, draining: bool = False) -> Heartbeat:
        return Heartbeat(
            instance_id=instance, dc="A", model="m", model_version="1", waiting=0, running=0,
            tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=10, endpoint_ready=ready, draining=draining,
            ts=ts,
        )  # fmt: skip

    beats = [beat("old", t0 + s) for s in range(0, 60)]  # ready throughout, never a start
    beats += [beat("cold", t0 + 20 + s, ready=s >= 5) for s in range(40)]  # loading 5 s, no staged weights
    beats += [beat("warm", t0 + 45 + s, ready=s >= 2) for s in range(15)]  # after a plan staged m in A
    beats += [beat("drain", t0 + s, draining=s >= 30) for s in range(40)]
    plans = [
        ReplicaPlan(planner="fm", model="m", model_version="1", dc="A", replicas=3, ts=t0 + 10),
        ReplicaPlan(planner="fm", model="m", model_version="1", dc="A", replicas=3, warm=("m",), ts=t0 + 40),
    ]
    assert sink.write_heartbeats(beats) == len(beats)
    assert sink.write_plans([*plans, plans[0]]) == 2  # a redelivered plan is stored once
    stored = client.query(
        "SELECT replicas, warm, warm_given, planner FROM replica_plans ORDER BY ts"
    ).result_rows
    assert [tuple(row) for row in stored] == [(3, [], 0, "fm"), (3, ["m"], 1, "fm")]
    assert client.query("SELECT countIf(draining = 1) FROM heartbeats").result_rows[0][0] == 10

    (panel,) = [p for p in panels(load("goodput.json")) if p["title"].startswith("Replicas per model")]
    (target,) = panel["targets"]
    rows = client.query(expand_macros(target["rawSql"], int(t0) - 60, int(t0) + 600, 60)).result_rows
    series: dict[str, float] = {}
    for _time, name, value in rows:
        series[name] = max(series.get(name, 0.0), value)
    assert series == {
        "m desired": 3.0,
        "m ready": 3.0,
        "m draining": 1.0,
        "m cold starts": 1.0,
        "m warm starts": 1.0,
    }


if __name__ == "__main__":
    _child(sys.argv[1])
