"""kopf's API scans run as tasks whose exceptions it never retrieves: a scan cut off by a closed
connection (the operator stopping mid-scan, seen in a loaded CI run) must not print a traceback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from kubetrain.operator.run import _kopf_scan_errors

pytestmark = pytest.mark.unit


async def _read_old_api() -> None:  # named as kopf's scan
    raise aiohttp.ClientConnectionError("Connection closed")


async def something_else() -> None:
    raise aiohttp.ClientConnectionError("Connection closed")


class Loop:
    def __init__(self) -> None:
        self.reported: list[dict[str, Any]] = []

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.reported.append(context)


def failed(coro: Any) -> dict[str, Any]:
    async def run() -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        await asyncio.wait([task])
        return task

    task = asyncio.run(run())
    return {"message": "Task exception was never retrieved", "future": task, "exception": task.exception()}


def test_a_cut_off_kopf_scan_is_one_warning_and_anything_else_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop()
    with caplog.at_level(logging.WARNING, logger="kubetrain.operator"):
        _kopf_scan_errors(loop, failed(_read_old_api()))  # type: ignore[arg-type]
    assert loop.reported == [] and "kopf's API scan _read_old_api was cut off: Connection closed" in caplog.text
    other = failed(something_else())
    _kopf_scan_errors(loop, other)  # type: ignore[arg-type]
    assert loop.reported == [other]
