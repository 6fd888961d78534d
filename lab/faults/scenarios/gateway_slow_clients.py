"""``gateway_slow_clients``: 1 000 idle connections and 10 slowloris clients hold the gateway while
normal calls go through it; the gateway cuts the slow ones after its header timeout."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from lab.faults.gateway_harness import GatewayRun, GatewayScenario
from lab.faults.gateway_tally import wait_p99
from lab.gateway_hold import Holders, HoldOptions, fit_open_files

PHASE_CALLS = 100
PHASE_S = 30.0
IDLE = 1000
SLOW = 10
HOLD_MAX_S = 60.0


async def _body(run: GatewayRun) -> None:
    """Three phases of 100 calls over 30 s each: ``alone``, ``held`` (``lab.gateway_hold.
    Holders``: 1 000 silent connections and 10 clients sending headers at 1 byte/s, each
    reconnecting when cut, opened before the phase's calls and held until every slow client was
    cut once, 60 s at most) and ``alone_again`` (the run-to-run noise). ``p99_*_s``: each
    phase's answer-start p99 (``lab.faults.gateway_tally.wait_p99``); ``slow_cut`` / ``slow_cut_after_s``:
    slow connections the gateway cut and the longest time from a connection's first byte to its
    cut; ``idle_cut_while_held``: idle connections cut meanwhile. Targets: ``p99_held_s``
    within noise of the others, every slow client cut after the header timeout."""
    assert run.state is not None
    fit_open_files(IDLE + 2 * SLOW + 256)
    where = urlsplit(run.state.gateway_url)
    assert where.hostname is not None and where.port is not None
    spans: dict[str, tuple[float, float]] = {}

    async def phase(tag: str) -> None:
        began = time.time()
        await run.callers_for(tag).run(PHASE_CALLS, PHASE_S)
        spans[tag] = (began, time.time())

    await phase("alone")
    holders = Holders(where.hostname, where.port, HoldOptions(idle=IDLE, slow=SLOW, hold_max_s=HOLD_MAX_S))
    held_at = time.monotonic()
    await holders.start()
    try:
        await asyncio.sleep(1.0)  # every slow client sent its first bytes
        idle_open = holders.idle_open
        await phase("held")
        while len(holders.slow_cut) < SLOW and time.monotonic() - held_at < HOLD_MAX_S:
            await asyncio.sleep(0.2)
    finally:
        await holders.release()
    await asyncio.sleep(2.0)
    await phase("alone_again")
    run.traffic = (spans["alone"][0], spans["alone_again"][1])
    for tag, (start, end) in spans.items():
        p99 = wait_p99(run.calls, start, end)
        run.extra[f"p99_{tag}_s"] = None if p99 is None else round(p99, 3)
    run.extra["idle_held"] = idle_open
    run.extra["idle_cut_while_held"] = len(holders.idle_cut)
    run.extra["slow_connections"] = holders.slow_connections
    run.extra["slow_cut"] = len(holders.slow_cut)
    run.extra["slow_cut_after_s"] = round(max(holders.slow_cut), 1) if holders.slow_cut else None
    run.extra["slow_answers"] = "; ".join(f"{k} x{n}" for k, n in holders.slow_said.items())


gateway_slow_clients = GatewayScenario(_body)
