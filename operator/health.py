"""The operator's probes on --health-port: `/healthz` (liveness) and `/readyz` (readiness).

Liveness is cheap: the event loop answered, so the process is not wedged. Readiness is true
only once every job and child that existed was listed into the caches (handlers.py), on the
leader and on a standby alike: a Ready standby is one that could take over without listing
anything. kopf's own liveness endpoint answered as soon as its startup handlers returned,
about a second before its TrainingJob watch had listed anything, and has no readiness.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


def app(ready: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready: the caches are not listed yet\n")

    application = web.Application()
    application.router.add_get("/healthz", healthz)
    application.router.add_get("/readyz", readyz)
    return application


async def serve(port: int, ready: Callable[[], bool]) -> web.AppRunner:
    """Serve the probes on 0.0.0.0:`port` until the returned runner's `cleanup()`."""
    runner = web.AppRunner(app(ready))
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
