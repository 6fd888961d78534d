"""``tokenfleet up --planner`` for real: a stack of emulated vLLM servers that follows a real
planner (``hpa``, planning every second, its scale-down window shortened through
``--planner-param``; the servers load in 2 s through ``--load-s``). A load step through the
gateway (the official ``openai`` client, more calls at once than one server runs) makes the
planner ask for a second server: it starts, loads, and receives calls once ready. When the load
falls to a trickle the planner asks for one: a server drains (the dispatcher heartbeats it
``draining: true``, ``status`` shows it) and stops once idle, and its slot is standby again.
Every call made meanwhile is answered in full: none failed, none lost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from infra.kafka.clients import partition_reader
from infra.kafka.connection import KafkaConnection
from local.state import StackState, alive, group_members, left_over, marked, read_state
from schemas.codec import decode
from schemas.events import Heartbeat
from schemas.topics import HEARTBEATS
from streams.clients import stop_client

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama3-8b"
ANSWER_TOKENS = 100
LOAD_STEP_CALLERS = 12  # one server runs 2 at once (--max-num-seqs): 10 wait, hpa's target is 5
TRICKLE_CALLERS = 2


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without its stack settings; data and probes the test's own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFLEET_")}
    return {
        **base,
        "TOKENFLEET_DATA_DIR": str(tmp_path / "data"),
        "TOKENFLEET_WORKER_WEB_PORT": "0",
        "TOKENFLEET_DISPATCHER_WEB_PORT": "0",
        "TOKENFLEET_PLANNER_WEB_PORT": "0",
    }


def tokenfleet(
    args: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def logs(directory: Path) -> str:
    return "\n".join(
        f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:]
        for path in sorted(directory.glob("*.log"))
    )


@pytest.fixture
def stack_dir(tmp_path: Path, env: dict[str, str]) -> Iterator[Path]:
    directory = (tmp_path / "up").resolve()
    yield directory
    tokenfleet(["down", "--dir", str(directory)], env)


def servers(directory: Path) -> dict[str, str]:
    """Emulated server -> its state as the supervisor recorded it."""
    state = read_state(directory)
    assert state is not None
    return {p.name: p.state for p in state.parts if p.kind == "emulated"}


def served(state: StackState, name: str) -> int:
    """Calls the emulated server ``name`` started (its ``/debug/served``); 0 if it does not answer."""
    url = state.part(name).address.removesuffix("/v1") + "/debug/served"
    try:
        with urllib.request.urlopen(url, timeout=5) as page:
            return sum(json.load(page)["requests"].values())
    except OSError:
        return 0


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, directory: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s\n{logs(directory)}"
        time.sleep(0.2)


class Callers:
    """Threads calling the gateway until told to stop; every outcome is kept."""

    def __init__(self, client: OpenAI) -> None:
        self.client = client
        self.outcomes: list[str] = []  # "ok", or what went wrong
        self.started = 0
        self._lock = threading.Lock()
        self._threads: list[tuple[threading.Thread, threading.Event]] = []

    def add(self, n: int) -> None:
        for _ in range(n):
            stop = threading.Event()
            thread = threading.Thread(target=self._call, args=(stop,), daemon=True)
            self._threads.append((thread, stop))
            thread.start()

    def stop(self, n: int | None = None) -> None:
        """Stop ``n`` callers (None: all) once their call in flight is answered."""
        chosen = self._threads[-n:] if n is not None else self._threads
        for _, stop in chosen:
            stop.set()
        for thread, _ in chosen:
            thread.join(timeout=120)
        self._threads = [t for t in self._threads if t not in chosen]

    def _call(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._lock:
                self.started += 1
            try:
                answer = self.client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Say something about autoscaling."}],
                    max_tokens=ANSWER_TOKENS,
                    extra_body={"ignore_eos": True},
                )
                whole = answer.usage is not None and answer.usage.completion_tokens == ANSWER_TOKENS
                outcome = "ok" if whole else f"short answer: {answer.usage}"
            except Exception as exc:  # every failure is counted, whatever its kind
                outcome = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.outcomes.append(outcome)


def heartbeats(bootstrap: str) -> list[Heartbeat]:
    """Every heartbeat on the stack's broker."""

    async def read() -> list[Heartbeat]:
        reader = await partition_reader(
            KafkaConnection.plaintext(bootstrap), [HEARTBEATS], "beginning", "test"
        )
        try:
            ends = await reader.end_offsets(list(reader.assignment()))
            found: list[Heartbeat] = []
            while [tp for tp, end in ends.items() if await reader.position(tp) < end]:
                for records in (await reader.getmany(timeout_ms=500)).values():
                    found += [decode(Heartbeat, r.value) for r in records]
            return found
        finally:
            await stop_client(reader)

    return asyncio.run(read())


def test_a_load_step_starts_a_second_server_and_its_fall_drains_one_with_every_call_answered(
    stack_dir: Path, env: dict[str, str]
) -> None:
    began = time.monotonic()
    args = ["--engines", "emulated", "--servers", "1", "--max-servers", "2", "--policy", "tokenpilot"]
    args += ["--planner", "hpa", "--planner-interval", "1", "--planner-param", "scale_down_window_s=10"]
    args += ["--load-s", "2", "--max-num-seqs", "2", "--gateways", "1", "--port", "0"]
    up = tokenfleet(["up", *args, "--dir", str(stack_dir)], env)
    assert up.returncode == 0, up.stderr + logs(stack_dir)
    state = read_state(stack_dir)
    assert state is not None and state.phase == "ready"
    assert [p.name for p in state.parts] == [
        "broker", "emulated-0", "emulated-1", "worker", "dispatcher", "planner", "gateway",
    ]  # fmt: skip
    assert servers(stack_dir) == {"emulated-0": "ready", "emulated-1": "standby"}
    key = Path(state.api_key_file).read_text().strip()
    callers = Callers(OpenAI(base_url=state.gateway_url, api_key=key, max_retries=0, timeout=120))

    try:
        # The step: more calls than one server runs. A second server starts, loads, serves.
        callers.add(LOAD_STEP_CALLERS)
        seen: set[str] = set()

        def second_ready() -> bool:
            seen.add(servers(stack_dir)["emulated-1"])
            return "ready" in seen

        wait_for(second_ready, 60, "a second server started and ready", stack_dir)
        assert "loading" in seen  # it loaded first (2 s): no call could reach it then
        wait_for(
            lambda: served(state, "emulated-1") >= 3, 30, "calls answered by the second server", stack_dir
        )

        # The fall: a trickle, one server's worth. One server drains and stops; the calls go on.
        callers.stop(LOAD_STEP_CALLERS - TRICKLE_CALLERS)
        history: list[dict[str, str]] = []

        def one_standby() -> bool:
            history.append(servers(stack_dir))
            return "standby" in history[-1].values()

        wait_for(one_standby, 90, "a server drained and stopped", stack_dir)
        (drained,) = [name for name, now in history[-1].items() if now == "standby"]
        (kept,) = [name for name in history[-1] if name != drained]
        states_of_drained = [h[drained] for h in history]
        assert "draining" in states_of_drained, states_of_drained
        assert states_of_drained.index("draining") < len(states_of_drained) - 1
        status = tokenfleet(["status", "--dir", str(stack_dir)], env)
        assert status.returncode == 0 and "standby" in status.stdout, status.stdout
        before = served(state, kept)
        time.sleep(2.0)
        assert served(state, kept) > before  # the trickle goes on, on the server kept
    finally:
        callers.stop()

    assert callers.started == len(callers.outcomes)  # none lost: every call came back
    failed = [o for o in callers.outcomes if o != "ok"]
    assert failed == [], failed[:5]
    assert len(callers.outcomes) > LOAD_STEP_CALLERS

    beats = [b for b in heartbeats(state.bootstrap) if b.instance_id == drained]
    assert any(b.draining for b in beats) and not beats[0].draining  # the dispatcher said so
    first_draining = next(i for i, b in enumerate(beats) if b.draining)
    assert all(b.draining for b in beats[first_draining:])  # from then on, until it stopped

    last = read_state(stack_dir)  # the servers' processes as they are now
    assert last is not None
    down = tokenfleet(["down", "--dir", str(stack_dir)], env)
    assert down.returncode == 0, down.stderr
    assert not alive(last.supervisor_pid, last.supervisor_start)
    for part in last.parts:
        assert part.pid is None or group_members(part.pid) == [], part
    assert marked(stack_dir) == [] and left_over(stack_dir, last) == []
    print(f"\nup --planner hpa: load step, scale-up, drain, stop in {time.monotonic() - began:.0f} s")
