"""Loaded by every Python started with this directory on PYTHONPATH (benchmarks/profile_operator.py
does so for the operator only). With KUBETRAIN_TRACEMALLOC_OUT set, traces allocations from
start-up and, at exit (the operator exits cleanly on SIGTERM), writes where the memory still
held was allocated: the top lines and the top packages, as JSON, on SIGUSR1 (the operator's
graceful stop can outlast the grace its tests give it, so atexit would be too late)."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc

OUT = os.environ.get("KUBETRAIN_TRACEMALLOC_OUT")


def _package(filename: str) -> str:
    for marker in ("site-packages/", "kubetrain/", "lib/python3"):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return marker.rstrip("/") + ":" + tail.split("/", 1)[0]
    return filename


def _dump(*_: object) -> None:
    snapshot = tracemalloc.take_snapshot()
    total = sum(s.size for s in snapshot.statistics("filename"))
    lines = snapshot.statistics("lineno")[:40]
    packages: dict[str, int] = {}
    for stat in snapshot.statistics("filename"):
        key = _package(stat.traceback[0].filename)
        packages[key] = packages.get(key, 0) + stat.size
    result = {
        "traced_mib": round(total / 2**20, 2),
        "top_lines": [
            {"where": str(s.traceback[0]), "mib": round(s.size / 2**20, 3), "blocks": s.count} for s in lines
        ],
        "by_package_mib": {k: round(v / 2**20, 2) for k, v in sorted(packages.items(), key=lambda kv: -kv[1])[:25]},
    }
    with open(f"{OUT}.part", "w") as out:
        json.dump(result, out, indent=2)
    os.replace(f"{OUT}.part", str(OUT))  # the reader waits for the file: never a half-written one


if OUT:
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, _dump)
