"""The in-place restart's report of a gang's first failure, from two real torchrun agents on
loopback with kubetrain's hooks loaded as `run --local` loads them. What torch's agent does
around the hooks (when it sets its workers' ids, how often it looks at them) is the truth here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import free_port
from support.waiting import wait_for

from kubetrain.api.contract import ATTEMPT_FILE_ENV
from kubetrain.local.localize import SITE_DIR

pytestmark = pytest.mark.train

# Rank 1 exits 3. Rank 0 waits until rank 1 is dead (a zombie, or reaped), then exits 4 0.3 s later
# on its own: more than an agent's thread can lag behind a death on a loaded machine. Node 0's agent
# looks every 0.1 s, node 1's every 3 s (well inside the 5 s the agents wait for each other): node 0
# usually registers its failure first, but node 1's worker died first.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    mark = sys.argv[1]
    dist.barrier()
    if dist.get_rank() == 1:
        with open(mark + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(mark + ".tmp", mark)
        os._exit(3)
    while not os.path.exists(mark):
        time.sleep(0.005)
    stat = "/proc/%s/stat" % open(mark).read()
    while os.path.exists(stat) and open(stat).read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.005)
    time.sleep(0.3)
    os._exit(4)
    """
)


def start_agent(tmp_path: Path, node: int, port: int, monitor_s: float) -> subprocess.Popen[str]:
    attempt = tmp_path / f"attempt-{node}"
    attempt.write_text("0")
    env = {**os.environ, ATTEMPT_FILE_ENV: str(attempt), "PYTHONPATH": str(SITE_DIR), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
    command += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=3"]
    command += [f"--monitor-interval={monitor_s}", str(tmp_path / "worker.py"), str(tmp_path / "rank1-pid")]
    out = (tmp_path / f"node-{node}.log").open("w")
    return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)


def failure_record(tmp_path: Path, node: int) -> dict[str, Any] | None:
    for line in (tmp_path / f"node-{node}.log").read_text().splitlines():
        if line.startswith('{"event":"failure"'):
            record: dict[str, Any] = json.loads(line)
            return record
    return None


def test_the_worker_that_died_first_is_blamed_though_its_agent_looked_last(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    port = free_port()
    agents = [start_agent(tmp_path, 0, port, 0.1), start_agent(tmp_path, 1, port, 3.0)]
    try:
        for node, proc in enumerate(agents):
            wait_for(lambda n=node: failure_record(tmp_path, n), 180, f"node {node}'s failure record", proc=proc)
    finally:
        for proc in agents:
            proc.terminate()
        for proc in agents:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    logs = "\n".join(f"--- node {n}\n" + (tmp_path / f"node-{n}.log").read_text()[-2500:] for n in (0, 1))
    for node in (0, 1):
        record = failure_record(tmp_path, node)
        assert record is not None and record["reported_by"] == node
        # Both agents name node 1's exit 3, the earlier death, though node 0's agent saw its own first.
        assert (record["node"], record["rank"], record["exit_code"]) == (1, 1, 3), logs
