"""A stalled gang on the real control plane names the rank that hung, from the stacks every rank
wrote to its pod log (read through `pods/log`, as on any cluster): 3 nodes on the process node,
rank 1 of a script of its own blocks outside any collective at step 5, once."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from support.controlplane import ControlPlane, free_port
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode
from support.workloads import hang_rank1

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCRIPT = Path(inspect.getfile(hang_rank1))
HANG_LINE = next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "the culprit's line" in line)


def test_the_stalled_failure_names_rank_1_and_its_line(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, process_node: ProcessNode
) -> None:
    ns = cluster.namespace
    cluster.create_job(
        "hang",
        nodes=3,
        masterPort=free_port(),  # every pod shares the node's loopback
        command=["torchrun", str(SCRIPT)],
        checkpoint={"dir": "/checkpoints", "volume": {"persistentVolumeClaim": {"claimName": "ck"}}},
        runPolicy={"maxRestarts": 1, "hangTimeoutSeconds": 60},
    )
    job = cluster.wait_job("hang", has_condition("Succeeded"), "Succeeded after the stalled gang's restart", 600)
    logs = {rank: process_node.logs(ns, f"hang-node-{rank}") for rank in range(3)}
    status = job["status"]
    assert (status["attempt"], status["restarts"]) == (1, 1), status
    (failure,) = status["failures"]
    assert (failure["reason"], failure["rank"], failure["pod"]) == ("Stalled", 1, "hang-node-1"), failure
    assert "rank 1 not in the collective ranks 0, 2 wait in" in failure["message"], failure["message"]
    assert f"{SCRIPT}:{HANG_LINE} in block_forever" in failure["message"], failure["message"]
    stalled = condition(job, "Stalled")
    assert stalled is not None and stalled["reason"] == "ProgressResumed", stalled
    events = [e.message for e in cluster.events("hang") if e.reason == "Stalled"]
    assert events and f"{SCRIPT}:{HANG_LINE} in block_forever" in events[0], events
    for rank, text in logs.items():
        assert "Timeout (0:00:30)!" in text, f"node {rank} wrote no stacks"
    # The stalled attempt's pods are gone; `kubetrain logs --attempt 0` reads every rank's stacks
    # from the attempt's log archive (operator/archive.py).
    kept = logs_of(crds_installed, ns, "hang", "--attempt", "0")
    assert kept.returncode == 0, kept.stderr
    for rank in range(3):
        mine = [line for line in kept.stdout.splitlines() if line.startswith(f"[node-{rank}] ")]
        assert any("Timeout (0:00:30)!" in line for line in mine), f"node {rank}'s archived log holds no stacks"
    assert any(
        line.startswith("[node-1] ") and f'{SCRIPT}", line {HANG_LINE}' in line for line in kept.stdout.splitlines()
    ), "node 1's archived stacks show where it hung"


def logs_of(cp: ControlPlane, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubetrain logs` as a user runs it."""
    kubetrain = Path(sys.executable).with_name("kubetrain")
    command = [str(kubetrain), "logs", *args, "-n", namespace, "--kubeconfig", str(cp.kubeconfig)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)
