"""Smoke test of benchmarks/teardown_stress.py at its smallest: one run of each workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_teardown_stress_writes_its_counts(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "teardown_stress.py"), "--runs", "2", "--load", "1"]
    subprocess.run([*command, "--out", str(out), "--keep", str(tmp_path / "runs")], check=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["setup"] == {"runs": 2, "busy_loops": 1, "workloads": ["builtin", "byo"]}
    builtin, byo = report["runs"]
    assert (builtin["workload"], byo["workload"]) == ("builtin", "byo")
    for run in (builtin, byo):
        assert run["outcome"] == "Succeeded", run
        assert set(run["markers"]) == {"terminate_called", "exit_barrier", "traceback"}
    # The built-in trainer's teardown is ours: one attempt, no crash text in any node's log.
    assert builtin["clean"], builtin
    assert report["totals"]["runs"] == 2
    assert report["totals"]["succeeded"] == 2
