"""``python -m local.emulated_vllm``: one emulated vLLM server (the package docstring is its contract).

Serves until SIGTERM or SIGINT. A bad argument, a port or endpoint already taken, a tokenizer
that cannot be read: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import signal
import sys
from pathlib import Path
from typing import NoReturn

import zmq
from aiohttp import web

from infra.prompts import PromptError, PromptTokenizer
from infra.settings import Settings
from local.emulated_vllm.engine import EmulatedEngine
from local.emulated_vllm.kv_events import KvPublisher, PromptBlocks
from local.emulated_vllm.server import EmulatedServer
from sim.engine.profiles import PROFILE_MODELS, PROFILES, get_profile

PROG = "python -m local.emulated_vllm"
TINY_MODEL = "tiny-llama"

log = logging.getLogger("local.emulated_vllm")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _speed(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0.001 <= value <= 1e6):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number in [0.001, 1e6]")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0 <= value <= 3600):
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds in [0, 3600]")
    return value


def _seqs(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number in [1, 100000]")
    return value


def _zmq_endpoint(text: str) -> str:
    if not text.startswith(("tcp://", "ipc://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a ZMQ endpoint (tcp://host:port)")
    return text


def parser() -> argparse.ArgumentParser:
    cli = _Parser(
        prog=PROG, description="An emulated vLLM server: one instance of the simulator's engine model."
    )
    cli.add_argument("--port", type=int, required=True, metavar="N", help="HTTP port")
    cli.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="HTTP address (default 127.0.0.1)")
    cli.add_argument(
        "--profile", default="llama3-8b-h100", metavar="NAME", help=f"engine profile: {', '.join(PROFILES)}"
    )
    cli.add_argument(
        "--served-model-name", metavar="NAME", help="the model name calls use (default: the profile's model)"
    )
    cli.add_argument(
        "--kv-events", type=_zmq_endpoint, metavar="ENDPOINT", help="bind the KV-event publisher here"
    )
    cli.add_argument(
        "--kv-replay", type=_zmq_endpoint, metavar="ENDPOINT", help="bind its replay endpoint here"
    )
    cli.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="a model directory's tokenizer.json (+ tokenizer_config.json); default: the tiny model, "
        f"built under TOKENFLEET_DATA_DIR/models/{TINY_MODEL}",
    )
    cli.add_argument(
        "--speed", type=_speed, default=1.0, metavar="X", help="emulated time runs X times faster"
    )
    cli.add_argument(
        "--max-num-seqs",
        type=_seqs,
        metavar="N",
        help="the most calls running at once, the rest wait (vLLM's flag; default: the profile's)",
    )
    cli.add_argument(
        "--load-s",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="seconds before the HTTP port opens, as vLLM's opens once its weights are loaded (default 0)",
    )
    return cli


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        profile = get_profile(args.profile)
    except ValueError as exc:
        fail(str(exc))
    if args.kv_replay and not args.kv_events:
        fail("--kv-replay needs --kv-events")
    if not 0 < args.port < 65536:
        fail(f"--port {args.port} is not in [1, 65535]")
    model = args.served_model_name or PROFILE_MODELS.get(profile.name, profile.name)
    if args.max_num_seqs is not None:
        profile = dataclasses.replace(profile, max_seqs=args.max_num_seqs)
    try:
        tokenizer = PromptTokenizer.from_dir(args.tokenizer or _tiny_model())
    except (PromptError, OSError, ValueError) as exc:
        fail(f"--tokenizer: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = EmulatedEngine(profile, model, args.speed)
    kv = None
    if args.kv_events:
        try:
            kv = KvPublisher(args.kv_events, args.kv_replay, PromptBlocks(engine.resident))
        except zmq.ZMQError as exc:
            fail(f"--kv-events {args.kv_events} / --kv-replay {args.kv_replay}: {exc}")
    banner = (
        f"emulated vLLM: {profile.name} as {model!r} on http://{args.host}:{args.port}, speed "
        f"{args.speed:g}, KV events {args.kv_events or 'off'}"
    )
    server = EmulatedServer(engine, tokenizer, model, kv)
    try:
        asyncio.run(_serve(server, args.host, args.port, banner, args.load_s))
    except OSError as exc:  # the address is taken or cannot be bound
        fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}")
    finally:
        if kv is not None:
            kv.close()
    return 0


async def _serve(server: EmulatedServer, host: str, port: int, banner: str, load_s: float = 0.0) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    tasks = [loop.create_task(server.engine.run())]
    if server.kv is not None:
        tasks.append(loop.create_task(server.kv.serve_replay()))
    try:
        if load_s > 0:  # "loading the weights": the port opens afterwards (a signal stops the wait)
            log.info("loading for %g s", load_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), load_s)
            if stop.is_set():
                return
        await web.TCPSite(runner, host, port).start()
        log.info("%s", banner)
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runner.cleanup()


def _tiny_model() -> Path:
    from local.tiny_model import ensure_tiny_model

    return ensure_tiny_model(Settings().data_dir.resolve() / "models" / TINY_MODEL, TINY_MODEL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
