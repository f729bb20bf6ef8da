"""A user's own torchrun line configured by `$(VAR)` references, as Kubeflow's PyTorchJob
examples write it, trains through `kubetrain run --local` (the expansion rules: test_expansion.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from support.jobs import fake_job, write_job
from support.local_runs import run_cli, summary

pytestmark = pytest.mark.train

# The launch line of Kubeflow's own PyTorchJob examples: torchrun configured by $(VAR) references.
SCRIPT = textwrap.dedent(
    """
    import json, os, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        # 1 + 2: both nodes joined the all-reduce.
        print(json.dumps({"event": "step", "time": time.time(), "step": 1, "loss": total.item()}), flush=True)
    dist.destroy_process_group()
    """
)


def test_torchrun_configured_by_references_trains(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    args = [
        "--nnodes=$(NNODES)",
        "--node_rank=$(NODE_RANK)",
        "--nproc_per_node=1",
        "--master_addr=$(MASTER_ADDR)",
        "--master_port=$(MASTER_PORT)",
        str(script),
    ]
    job = fake_job("", nodes=2)
    job["spec"]["command"] = [torchrun]
    job["spec"]["args"] = args
    done = run_cli("run", str(write_job(tmp_path, job)), "--local", "--run-dir", str(tmp_path / "run"), timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = summary(tmp_path / "run")
    assert (result["outcome"], result["restarts"], result["nodeExitCodes"]) == ("Succeeded", 0, [0, 0])
    assert (result["finalStep"], result["finalLoss"]) == (1, 3.0)
