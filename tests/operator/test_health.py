"""The probes (operator/health.py): liveness answers from the start, readiness only once the
caches are listed."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from support.controlplane import free_port

from kubetrain.operator import health

pytestmark = pytest.mark.unit


def test_readiness_waits_for_the_caches_and_liveness_does_not() -> None:
    synced = False

    async def scenario() -> list[tuple[str, int]]:
        nonlocal synced
        port = free_port()
        runner = await health.serve(port, lambda: synced)
        seen = []
        try:
            async with aiohttp.ClientSession() as session:
                for path in ("/healthz", "/readyz"):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        seen.append((path, response.status))
                synced = True
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    seen.append(("/readyz", response.status))
        finally:
            await runner.cleanup()
        return seen

    assert asyncio.run(scenario()) == [("/healthz", 200), ("/readyz", 503), ("/readyz", 200)]
