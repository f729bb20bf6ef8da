"""benchmarks/real_node.py runs at its smallest size and writes its JSON (tests/test_benchmarks.py
does the same for the other benchmarks; this one needs a real node, hence here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import nodepods
from support.benchmarks import run_benchmark

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def test_real_node_benchmark_runs(tmp_path: Path) -> None:
    nodepods.node_or_skip()
    result = run_benchmark("real_node.py", tmp_path / "real_node.json", "--repeats", "1")
    (run,) = result["runs"]
    assert {"kubelet", "containerd", "coredns", "kube-apiserver"} <= set(run["rss_mib"])
    assert result["node_up_s"] > 0 and result["pod_create_to_running_s"] > 0 and result["teardown_s"] > 0
