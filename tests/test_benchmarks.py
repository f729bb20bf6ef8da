"""Every benchmark runs at a tiny size and writes its JSON: a clean-up that breaks one fails here
instead of rotting unnoticed (operator_latency.py once failed to import for weeks). The numbers
themselves are not checked: speed targets live in the benchmarks' own results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, output: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(output.read_text())
    return result


@pytest.mark.cluster
def test_operator_latency_benchmark_runs(control_plane: ControlPlane, tmp_path: Path) -> None:
    # control_plane: the benchmark starts its own from the same binaries; the fixture makes a
    # missing binary a skip (a failure in CI) with the usual message.
    result = run_benchmark(
        "operator_latency.py", tmp_path / "latency.json", "--jobs", "2", "--nodes", "2", "--repeat", "1"
    )
    (run,) = result["runs"]
    assert run["latency_s"]["p50"] > 0 and run["api_writes_per_job"] > 0
    assert len(result["summary"]["p50_s_per_run"]) == 1


@pytest.mark.slow
def test_local_startup_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("local_startup.py", tmp_path / "startup.json", "--repeats", "1")
    assert result["repeats"] == 1 and result["to_first_step_s"]["median"] > 0
