"""The head every benchmark's JSON starts with: its name, when, and the machine it ran on."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
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


def write_report(output: Path, report: dict[str, Any]) -> None:
    """The report as indented JSON at `output` (its folder made), and its summary on stdout."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report.get("summary"), indent=2))


def paired_arguments(description: str, results: Path) -> argparse.Namespace:
    """The arguments of a benchmark that runs its variants side by side: --repeats, --output, --keep."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (one of each variant)")
    parser.add_argument("--output", type=Path, default=results)
    parser.add_argument("--keep", type=Path, help="keep the runs' dirs (logs, status) under this folder")
    return parser.parse_args()


def paired_runs(
    args: argparse.Namespace, variants: Sequence[str], run_once: Callable[[Path, str, int], dict[str, Any]], prefix: str
) -> list[dict[str, Any]]:
    """Each repeat runs every variant, in turn forwards and backwards (so that neither always runs
    on a machine the other just warmed), in `--keep` or a temporary folder; each run's JSON printed."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for index in range(args.repeats):
            for variant in variants if index % 2 == 0 else variants[::-1]:
                runs.append(run_once(where, variant, index))
                print(json.dumps(runs[-1]), flush=True)
    return runs
