"""The emulated vLLM server's ``--load-s`` (its port opens once "the weights are loaded", as
vLLM's does: a planned stack's load time) and ``--max-num-seqs`` (calls beyond it wait, as
vLLM's flag makes them: what the ``hpa`` planner scales on), and the values they refuse."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time

import pytest

from infra.prompts import PromptTokenizer
from local.emulated_vllm.__main__ import _serve, main
from local.emulated_vllm.engine import EmulatedEngine
from local.emulated_vllm.server import EmulatedServer
from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import free_ports
from schemas.events import InferenceRequest
from sim.engine.profiles import get_profile


def answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PromptTokenizer:
    return PromptTokenizer.from_dir(ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model", "tiny"))


def test_the_port_opens_once_loaded(tokenizer: PromptTokenizer) -> None:
    engine = EmulatedEngine(get_profile("llama3-8b-h100"), "tiny")
    (port,) = free_ports(1)

    async def run() -> list[tuple[float, bool]]:
        server = EmulatedServer(engine, tokenizer, "tiny")
        serving = asyncio.create_task(_serve(server, "127.0.0.1", port, "", 0.4))
        began, seen = time.monotonic(), []
        try:
            for _ in range(8):
                await asyncio.sleep(0.1)
                seen.append((time.monotonic() - began, answers(port)))
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        return seen

    seen = asyncio.run(run())
    assert not any(up for at, up in seen if at < 0.35) and all(up for at, up in seen if at > 0.7), seen


def test_calls_beyond_max_num_seqs_wait() -> None:
    profile = get_profile("llama3-8b-h100")
    engine = EmulatedEngine(dataclasses.replace(profile, max_seqs=2), "m")

    async def run() -> tuple[int, int]:
        driver = asyncio.create_task(engine.run())
        for n in range(5):
            engine.start(
                InferenceRequest(request_id=f"r{n}", model="m", input_tokens=10, output_budget=500), 500
            )
        await asyncio.sleep(0.1)
        beat = engine.load()
        while not driver.done():  # (a cancel that lands as its wait ends is lost: asyncio.wait_for)
            driver.cancel()
            await asyncio.sleep(0.01)
        return beat.running, beat.waiting

    assert asyncio.run(run()) == (2, 3)


@pytest.mark.parametrize(
    ("flag", "value"), [("--load-s", "-1"), ("--load-s", "nan"), ("--max-num-seqs", "0")]
)
def test_bad_values_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--port", "8000", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err, err
