"""A process's own HTTP endpoints for operators: ``/metrics`` (Prometheus), ``/health`` (live:
the event loop answers) and ``/ready`` (serving: ``ready()`` is true), on ``host:port``.

For processes without a web server of their own (the dispatcher); the worker serves the same
three paths from Faust's web server (``worker/probes.py``), the gateway from its API server.
Kubernetes probes: liveness on ``/health``, readiness on ``/ready``.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from infra import metrics


async def start_probes(host: str, port: int, ready: Callable[[], bool]) -> web.AppRunner:
    """Serve the three paths until the returned runner is cleaned up (``await runner.cleanup()``);
    ``port=0`` takes any free port (``bound_port(runner)``)."""

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def is_ready(_request: web.Request) -> web.Response:
        ok = ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def prometheus(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/ready", is_ready)
    app.router.add_get("/metrics", prometheus)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port ``runner`` listens on."""
    (address, *_) = runner.addresses
    return int(address[1])
