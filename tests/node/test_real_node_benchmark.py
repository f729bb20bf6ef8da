"""benchmarks/real_node.py runs at its smallest size and writes its JSON (tests/test_benchmarks.py
does the same for the other benchmarks; this one needs a real node, hence here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import nodepods

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def test_real_node_benchmark_runs(tmp_path: Path) -> None:
    nodepods.node_or_skip()
    output = tmp_path / "real_node.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "real_node.py"), "--repeats", "1", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(output.read_text())
    (run,) = result["runs"]
    assert {"kubelet", "containerd", "coredns", "kube-apiserver"} <= set(run["rss_mib"])
    assert result["node_up_s"] > 0 and result["pod_create_to_running_s"] > 0 and result["teardown_s"] > 0
