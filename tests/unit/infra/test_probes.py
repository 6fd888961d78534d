"""The dispatcher's probes: live at once, ready only when serving, Prometheus text."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from infra.probes import bound_port, start_probes


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_probes_say_live_ready_and_serve_metrics() -> None:
    serving: list[bool] = []  # empty: not serving yet

    async def scenario() -> list[tuple[int, bytes]]:
        runner = await start_probes("127.0.0.1", 0, lambda: bool(serving))
        base = f"http://127.0.0.1:{bound_port(runner)}"
        try:
            seen = [await asyncio.to_thread(_get, base + path) for path in ("/health", "/ready", "/metrics")]
            serving.append(True)
            return [*seen, await asyncio.to_thread(_get, base + "/ready")]
        finally:
            await runner.cleanup()

    health, not_ready, metrics, ready = asyncio.run(scenario())
    assert health == (200, b'{"live": true}')
    assert not_ready[0] == 503 and json.loads(not_ready[1]) == {"ready": False}
    assert metrics[0] == 200 and b"# HELP" in metrics[1]
    assert ready[0] == 200
