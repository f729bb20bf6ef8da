"""The head every benchmark's JSON starts with: its name, when, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import time
from typing import Any


def report_head(benchmark: str, load_before: tuple[float, ...] | list[float], **machine: Any) -> dict[str, Any]:
    """`{"benchmark", "date", "machine": {...}}`: the machine's CPUs, platform and Python, the load
    average before the runs and now (after them), and what else the benchmark says of it."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "logical_cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            **machine,
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
        },
    }
