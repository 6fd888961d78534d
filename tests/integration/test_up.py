"""``tokenfleet up``, ``status`` and ``down`` for real, as a user runs them (each a process):
local vLLM servers answering the official ``openai`` client through the gateway with the key
``up`` printed; emulated vLLM servers answering it the same way (streams, usage, prefix-aware
routing on their KV events), in a stack whose supervisor restarts a killed part (and counts the
worker's restarts of its decider), refuses a second ``up`` and is cleaned up by ``down`` even
once the supervisor itself was killed; a start that fails; ``--foreground`` and Ctrl-C. After
every ``down`` no process of the stack is left: not the supervisor, no part, nothing in a part's
process group (vLLM's engine core included), nothing carrying the stack's marker."""

from __future__ import annotations

import json
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

from local.state import StackState, alive, group_members, left_over, marked, read_state
from local.vllm_launcher import ENGINE_MISSING, engine_python_or_none

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


def calls_served(state: StackState) -> dict[str, dict[str, int]]:
    """Emulated server -> {request id: times it started that call} (its ``/debug/served``)."""
    found = {}
    for part in state.parts:
        if part.kind == "emulated":
            url = part.address.removesuffix("/v1") + "/debug/served"
            with urllib.request.urlopen(url, timeout=10) as page:
                found[part.name] = json.load(page)["requests"]
    return found


def calls_started(state: StackState) -> dict[str, int]:
    """Emulated server -> the calls it started so far."""
    return {name: sum(served.values()) for name, served in calls_served(state).items()}


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
    assert [p.name for p in state.parts] == [
        "broker",
        "vllm-0",
        "worker",
        "dispatcher",
        "gateway",
        "gateway-2",
    ]
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
            ("gateway-2", "gateway"), ("vllm-0", "engine"),
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


def test_emulated_servers_answer_the_openai_client_and_the_stack_is_supervised(
    stack_dir: Path, env: dict[str, str]
) -> None:
    args = ["--engines", "emulated", "--servers", "2", "--policy", "slomax+tokenpilot", "--port", "0"]
    up = tokenfleet(["up", *args, "--dir", str(stack_dir)], env)
    assert up.returncode == 0, up.stderr + logs(stack_dir)
    state = read_state(stack_dir)
    assert state is not None and state.phase == "ready"
    names = ["broker", "emulated-0", "emulated-1", "worker", "dispatcher", "gateway", "gateway-2"]
    assert [p.name for p in state.parts] == names
    key = re.search(r'api_key="(tf-[^"]+)"', up.stdout)
    assert key and f'base_url="{state.gateway_url}"' in up.stdout and 'model="llama3-8b"' in up.stdout

    # The whole gateway path, as the official client calls it.
    client = OpenAI(base_url=state.gateway_url, api_key=key.group(1), max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Say something about Kafka."}]
    answer = client.chat.completions.create(
        model="llama3-8b",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": "up-chat-1"},
    )
    assert answer.id == "chatcmpl-up-chat-1" and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model="llama3-8b",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    started = [served for engine in calls_served(state).values() for served in engine.items()]
    assert len(started) == 2 and ("up-chat-1-1", 1) in started  # each attempt once, as <id>-<attempt>

    # Prefix-aware routing on the engines' KV events: once the first call's blocks are known,
    # the calls that share its prefix (4 blocks of 512 tokens and more) land where it is cached.
    document = "A long shared document that every call starts with. " * 200
    asked = iter(range(1000))

    def cached() -> int:
        """Prompt tokens the engine found cached for one more call on the document."""
        reply = client.completions.create(
            model="llama3-8b", prompt=f"{document} Question {next(asked)}?", max_tokens=2
        )
        assert reply.usage is not None and reply.usage.prompt_tokens > 2048
        details = reply.usage.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0

    before = calls_started(state)
    assert cached() == 0
    (first,) = [name for name, started in calls_started(state).items() if started > before[name]]
    time.sleep(1.0)  # its blocks' KV events reach the decider (through the dispatcher and the broker)
    wait_for(lambda: cached() >= 2048, 30, "a call routed to the cached prefix")
    before = calls_started(state)
    assert [cached() >= 2048 for _ in range(3)] == [True] * 3
    after = calls_started(state)
    assert {name: after[name] - before[name] for name in after} == {
        name: 3 if name == first else 0 for name in after
    }  # where the document was cached first

    # A part that dies is started again; so is the decider inside the worker, and status counts both.
    dispatcher = state.part("dispatcher").pid
    worker = state.part("worker").pid
    assert dispatcher is not None and worker is not None
    os.killpg(dispatcher, signal.SIGKILL)
    (decider,) = [pid for pid in group_members(worker) if pid != worker]
    os.kill(decider, signal.SIGKILL)

    def restarted() -> bool:
        now = read_state(stack_dir)
        return (
            now is not None
            and (now.part("dispatcher").restarts, now.part("worker").child_restarts) == (1, 1)
            and now.part("dispatcher").state == "ready"
        )

    wait_for(restarted, 120, "the dispatcher restarted and the decider restarted")
    status = tokenfleet(["status", "--dir", str(stack_dir)], env)
    assert re.search(r"worker\s+│ ready\s+│ decider 1 ", status.stdout), status.stdout
    assert re.search(r"dispatcher\s+│ \w[\w ]*│ 1 ", status.stdout), status.stdout
    wait_for(lambda: tokenfleet(["status", "--dir", str(stack_dir)], env).returncode == 0, 60, "all ready")
    again = client.completions.create(model="llama3-8b", prompt="after the restarts", max_tokens=3)
    assert again.usage is not None and again.usage.completion_tokens == 3

    # One stack per directory.
    again_up = tokenfleet(["up", *args, "--dir", str(stack_dir)], env)
    assert again_up.returncode == 2
    assert again_up.stderr == (
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
    args = ["up", "--engines", "emulated", "--port", "0", "--timeout", "2", "--dir", str(stack_dir)]
    up = tokenfleet(args, env)
    assert up.returncode == 1
    last = up.stderr.splitlines()[-1]
    assert re.fullmatch(r"tokenfleet up: error: [\w-]+ was not ready within 2 s; its log: \S+\.log", last), (
        up.stderr
    )
    state = read_state(stack_dir)
    assert state is not None and state.phase == "failed"
    assert_nothing_left(stack_dir, state)


def test_foreground_runs_until_ctrl_c(stack_dir: Path, env: dict[str, str]) -> None:
    args = ["up", "--engines", "emulated", "--port", "0", "--foreground", "--dir", str(stack_dir)]
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
    assert b"emulated-0" in out and b"from openai import OpenAI" in out
    state = read_state(stack_dir)
    assert state is not None and state.phase == "stopped" and state.supervisor_pid == process.pid
    assert_nothing_left(stack_dir, state)
