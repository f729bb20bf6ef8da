"""benchmarks/teardown_stress_pods.py at its smallest: one plain job and one whose node 1 pod is
deleted mid-run, on the real node with the images as built. The 20-job run's numbers are in
benchmarks/results/teardown_stress_pods.json; this shows the benchmark still runs and that both
kinds of job end clean: Succeeded by every node, nothing left Running, restarts only where a pod
was deleted, and no "terminate called" or "exit barrier" line in any pod's log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import images, nodepods
from support.benchmarks import run_benchmark
from support.controlplane import Unavailable
from support.tools import missing_tool

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[2]


def test_teardown_stress_in_real_pods_runs_and_ends_clean(tmp_path: Path) -> None:
    nodepods.node_or_skip()
    try:
        images.built()
    except Unavailable as missing:
        missing_tool(str(missing))
    options = ("--jobs", "2", "--load", "1", "--keep", str(tmp_path))
    result = run_benchmark("teardown_stress_pods.py", tmp_path / "pods.json", *options, timeout=3000)
    plain, interrupted = result["jobs"]
    assert (plain["interrupted"], interrupted["interrupted"]) == (False, True)
    assert "deleted_after_s" in interrupted and "deleted_after_s" not in plain
    for job in (plain, interrupted):
        assert job["clean"], job
    # Both pods' logs of each attempt were read: 2 for the plain job, 4 for the restarted one.
    assert (plain["logs_read"], interrupted["logs_read"]) == (2, 4), (plain, interrupted)
    assert (plain["restarts"], interrupted["restarts"]) == (0, 1)
    assert interrupted["failures"] == ["PodDeleted"], interrupted
    totals = result["totals"]
    assert totals["pods_left_running"] == 0 and totals["lines_terminate_called"] == totals["lines_exit_barrier"] == 0
    # The pods ran the image as shipped: the Dockerfile's torch, with the hooks its .pth loads.
    pinned = re.search(r"^ARG TORCH_VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert pinned is not None
    version, _, hooks = result["setup"]["trainer_torch"].partition(" ")
    assert (version.split("+")[0], hooks) == (pinned.group(1), "hooks True"), result["setup"]
