"""``tokenfleet up``, ``status`` and ``down`` for real, as a user runs them (each a process):
local vLLM servers answering the official ``openai`` client through the gateway with the key
``up`` printed; an emulated stack whose supervisor restarts a killed part, refuses a second
``up`` and is cleaned up by ``down`` even once the supervisor itself was killed; a start that
fails; ``--foreground`` and Ctrl-C. After every ``down`` no process of the stack is left: not
the supervisor, no part, nothing in a part's process group (vLLM's engine core included),
nothing carrying the stack's marker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from lab.local.state import StackState, alive, group_members, left_over, marked, read_state
from lab.vllm_launcher import ENGINE_MISSING, engine_python_or_none

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without its stack settings: data in the test's directory, the
    probes on free ports (another stack may hold 6066), the engine's python kept."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFLEET_")}
    keep = {k: os.environ[k] for k in ("TOKENFLEET_VLLM_PYTHON",) if k in os.environ}
    return {
        **base,
        **keep,
        "TOKENFLEET_DATA_DIR": str(tmp_path / "data"),
        "TOKENFLEET_WORKER_WEB_PORT": "0",
        "TOKENFLEET_DISPATCHER_WEB_PORT": "0",
    }


def tokenfleet(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def logs(directory: Path) -> str:
    """The end of every log of the stack, for a failing assertion."""
    return "\n".join(
        f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:]
        for path in sorted(directory.glob("*.log"))
    )


def assert_nothing_left(directory: Path, state: StackState) -> None:
    assert not alive(state.supervisor_pid, state.supervisor_start)
    for part in state.parts:
        if part.kind != "engine":
            assert part.pid is None or group_members(part.pid) == [], part
    assert marked(directory) == [] and left_over(directory, state) == []


@pytest.fixture
def stack_dir(tmp_path: Path, env: dict[str, str]) -> Iterator[Path]:
    """The stack's directory; whatever a test leaves running there is stopped after it."""
    directory = (tmp_path / "up").resolve()
    yield directory
    tokenfleet(["down", "--dir", str(directory)], env)


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(0.25)


def test_local_vllm_answers_the_openai_client_with_the_printed_key(
    stack_dir: Path, env: dict[str, str]
) -> None:
    if engine_python_or_none() is None:
        pytest.fail(ENGINE_MISSING, pytrace=False)
    started = time.monotonic()
    up = tokenfleet(
        ["up", "--engines", "local", "--servers", "1", "--port", "0", "--dir", str(stack_dir)], env, 600
    )
    assert up.returncode == 0, up.stderr + logs(stack_dir)
    up_s = time.monotonic() - started
    state = read_state(stack_dir)
    assert state is not None and state.phase == "ready"
    assert [p.name for p in state.parts] == ["broker", "vllm-0", "worker", "dispatcher", "gateway"]
    for part in state.parts:  # every address is in the table
        assert part.address in up.stdout
    base_url = re.search(r'base_url="([^"]+)"', up.stdout)
    key = re.search(r'api_key="(tf-[^"]+)"', up.stdout)
    model = re.search(r'model="([^"]+)"', up.stdout)
    assert base_url and key and model, up.stdout
    assert base_url.group(1) == state.gateway_url and model.group(1) == "tiny-llama"

    client = OpenAI(base_url=base_url.group(1), api_key=key.group(1), max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Say something about Kafka."}]
    answer = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_tokens=12,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2  # streamed: more than one chunk of text
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=base_url.group(1), api_key="tf-not-a-key", max_retries=0).models.list()
    request = urllib.request.Request(base_url.group(1) + "/models")  # no key at all
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401

    status = tokenfleet(["status", "--dir", str(stack_dir)], env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count(" ready ") >= 5

    # The README's recipe: a second stack in front of these servers, by their inventory. Its
    # down stops its own parts only: the engines are not its own.
    other = stack_dir.parent / "other"
    other_env = {**env, "TOKENFLEET_DATA_DIR": str(stack_dir.parent / "other-data")}
    inventory = ["--engines", "inventory", "--inventory", str(stack_dir / "inventory.yaml")]
    try:
        front = tokenfleet(
            ["up", *inventory, "--policy", "tokenpilot", "--port", "0", "--dir", str(other)], other_env
        )
        assert front.returncode == 0, front.stderr + logs(other)
        second = read_state(other)
        assert second is not None
        assert [(p.name, p.kind) for p in second.parts] == [
            ("broker", "broker"), ("worker", "worker"), ("dispatcher", "dispatcher"), ("gateway", "gateway"),
            ("vllm-0", "engine"),
        ]  # fmt: skip
        other_key = Path(second.api_key_file).read_text().strip()
        assert other_key != key.group(1)
        via = OpenAI(base_url=second.gateway_url, api_key=other_key, max_retries=0, timeout=120)
        assert via.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=4).choices  # type: ignore[arg-type]
        other_status = tokenfleet(["status", "--dir", str(other)], other_env)
        assert other_status.returncode == 0 and re.search(r"vllm-0\s+│ up ", other_status.stdout), (
            other_status.stdout
        )
    finally:
        assert tokenfleet(["down", "--dir", str(other)], other_env).returncode == 0
    assert_nothing_left(other, second)
    assert group_members(state.part("vllm-0").pid)  # still serving the first stack

    down = tokenfleet(["down", "--dir", str(stack_dir)], env)
    assert down.returncode == 0, down.stderr
    assert "none of it left" in down.stdout
    assert_nothing_left(stack_dir, state)
    print(f"\nup --engines local --servers 1: ready in {up_s:.0f} s; all {time.monotonic() - started:.0f} s")


def test_an_emulated_stack_is_supervised_and_down_stops_it_all(stack_dir: Path, env: dict[str, str]) -> None:
    up = tokenfleet(["up", "--engines", "emulated", "--dir", str(stack_dir)], env)
    assert up.returncode == 0, up.stderr + logs(stack_dir)
    assert "tokenfleet loadgen --workload synthetic" in up.stdout
    state = read_state(stack_dir)
    assert state is not None and [p.name for p in state.parts] == ["broker", "worker", "dispatcher"]

    # A part that dies is started again.
    dispatcher = state.part("dispatcher").pid
    assert dispatcher is not None
    os.killpg(dispatcher, signal.SIGKILL)

    def restarted() -> bool:
        now = read_state(stack_dir)
        return (
            now is not None
            and now.part("dispatcher").restarts == 1
            and now.part("dispatcher").state == "ready"
        )

    wait_for(restarted, 90, "the dispatcher restarted and ready")
    assert tokenfleet(["status", "--dir", str(stack_dir)], env).returncode == 0

    # One stack per directory.
    again = tokenfleet(["up", "--engines", "emulated", "--dir", str(stack_dir)], env)
    assert again.returncode == 2
    assert again.stderr == (
        f"tokenfleet up: error: a stack is already up in {stack_dir}: run `tokenfleet down --dir "
        f"{stack_dir}` first, or pass another --dir\n"
    )

    # Its supervisor killed, the parts run on; status says so, down still stops them all.
    state = read_state(stack_dir)
    assert state is not None
    os.kill(state.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not alive(state.supervisor_pid, state.supervisor_start), 10, "the supervisor gone")
    status = tokenfleet(["status", "--dir", str(stack_dir)], env)
    assert status.returncode == 1 and "supervisor gone" in status.stdout
    assert group_members(state.part("worker").pid)
    down = tokenfleet(["down", "--dir", str(stack_dir)], env)
    assert down.returncode == 0, down.stderr
    assert_nothing_left(stack_dir, state)
    assert tokenfleet(["down", "--dir", str(stack_dir)], env).stdout == f"nothing runs in {stack_dir}\n"


def test_a_part_not_ready_in_time_fails_the_start_and_stops_the_rest(
    stack_dir: Path, env: dict[str, str]
) -> None:
    up = tokenfleet(["up", "--engines", "emulated", "--timeout", "2", "--dir", str(stack_dir)], env)
    assert up.returncode == 1
    last = up.stderr.splitlines()[-1]
    assert re.fullmatch(r"tokenfleet up: error: \w+ was not ready within 2 s; its log: \S+\.log", last), (
        up.stderr
    )
    state = read_state(stack_dir)
    assert state is not None and state.phase == "failed"
    assert_nothing_left(stack_dir, state)


def test_foreground_runs_until_ctrl_c(stack_dir: Path, env: dict[str, str]) -> None:
    args = ["up", "--engines", "emulated", "--foreground", "--dir", str(stack_dir)]
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def ready() -> bool:
            state = read_state(stack_dir)
            assert process.poll() is None, logs(stack_dir)
            return state is not None and state.phase == "ready"

        wait_for(ready, 120, "the stack ready")
        process.send_signal(signal.SIGINT)
        out, _err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert b"dispatcher" in out and b"tokenfleet loadgen" in out
    state = read_state(stack_dir)
    assert state is not None and state.phase == "stopped" and state.supervisor_pid == process.pid
    assert_nothing_left(stack_dir, state)
