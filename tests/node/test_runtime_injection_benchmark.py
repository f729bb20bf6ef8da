"""benchmarks/runtime_injection.py: its summary pairs the runs with and without the runtime's
init container, and its smallest run on the real node writes the JSON docs/benchmarks.md cites."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import nodepods
from support.controlplane import Unavailable
from support.realjobs import operator_image, trainer_image

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import runtime_injection  # noqa: E402


def run(inject: bool, ready: float, start: float, init: list[float]) -> dict[str, Any]:
    return {"inject": inject, "ready_s": ready, "start_s": start, "init_container_s": init}


def test_the_summary_pairs_each_run_with_its_neighbour() -> None:
    runs = [
        run(True, 10.0, 12.0, [0.0, 1.0]),
        run(False, 9.0, 11.5, []),
        run(False, 8.0, 10.0, []),
        run(True, 11.0, 13.0, [1.0, 1.0]),
    ]
    summary = runtime_injection.summarize(runs)
    assert summary["ready_s"] == {
        "inject_median": 10.5,
        "no_inject_median": 8.5,
        "pair_difference_median": 2.0,
        "pair_differences": [1.0, 3.0],
    }
    assert summary["start_s"]["pair_differences"] == [0.5, 3.0]
    assert summary["init_container_s_median"] == 1.0


def test_the_benchmark_runs_on_the_real_node(tmp_path: Path) -> None:
    nodepods.node_or_skip()
    try:
        trainer_image(), operator_image()
    except Unavailable as missing:
        pytest.skip(str(missing))
    output = tmp_path / "runtime_injection.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "runtime_injection.py"), "--repeats", "1"]
    done = subprocess.run(
        [*command, "--output", str(output)], capture_output=True, text=True, timeout=1800, check=False
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(output.read_text())
    assert [r["inject"] for r in result["runs"]] == [True, False]
    injected, plain = result["runs"]
    assert len(injected["init_container_s"]) == 2 and plain["init_container_s"] == []
    assert all(r["ready_s"] > 0 and r["start_s"] > 0 for r in result["runs"])
