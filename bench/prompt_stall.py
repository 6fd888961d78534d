"""How long a long prompt stops the gateway's event loop while it is tokenized and hashed.

    python -m bench.prompt_stall [--kb 190] [--repeat 5]

A ``--kb`` KB prompt (at most 195: a prompt holds 200 000 characters; text of the project's
own sources) is completed (token count and prefix block hashes, ``infra.prompts.Prompts``)
with the tiny model's tokenizer, once inline on the event loop (``complete``, as the gateway
did) and once through ``complete_off_loop`` (a worker thread), while a ticker on the same loop
wakes every millisecond. Printed per way: the completion's wall time and the longest the ticker
waited (the stall every other call in the gateway would see), medians over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from infra.prompts import Prompts
from local.tiny_model import ensure_tiny_model
from schemas.events import InferenceRequest

MODEL = "tiny-llama"


async def _measure(complete: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(wall seconds of ``complete``, longest gap between the ticker's wake-ups)."""
    longest, done = 0.0, False

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await complete()
    wall = time.perf_counter() - started
    done = True
    await task
    return wall, longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=190, help="prompt size in KB, at most 195 (default 190)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per way (default 5)")
    args = parser.parse_args(argv)
    sources = "".join(
        p.read_text() for p in sorted(Path(__file__).resolve().parents[1].rglob("agents/**/*.py"))
    )
    text = (sources * (args.kb * 1024 // len(sources) + 1))[: args.kb * 1024]
    with tempfile.TemporaryDirectory() as scratch:
        prompts = Prompts.from_dirs({MODEL: ensure_tiny_model(Path(scratch) / "model", MODEL)})
        request = InferenceRequest(request_id="stall", model=MODEL, prompt=text, output_budget=8)
        tokens = prompts.complete(request).input_tokens

        async def inline() -> object:
            return prompts.complete(request)

        async def off_loop() -> object:
            return await prompts.complete_off_loop(request)

        print(f"prompt {args.kb} KB, {tokens} tokens; medians of {args.repeat} runs")
        for name, way in (("inline (before)", inline), ("complete_off_loop", off_loop)):
            runs = [asyncio.run(_measure(way)) for _ in range(args.repeat)]
            wall = statistics.median(r[0] for r in runs) * 1000
            stall = statistics.median(r[1] for r in runs) * 1000
            print(f"{name:18} completion {wall:7.1f} ms   longest event-loop stall {stall:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
