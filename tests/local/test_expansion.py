"""`$(VAR)` references in command, args and env, expanded as the kubelet expands them (rules of
k8s.io/kubernetes third_party/forked/golang/expansion) with the local values."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from support.jobs import fake_job, write_job
from support.local_runs import run_cli, summary

from kubetrain.local import plan as local
from kubetrain.local.localize import expand, expand_env

pytestmark = pytest.mark.unit

VARS = {"A": "a", "B": "b", "EMPTY": "", "WITH SPACE": "s", "DOLLAR": "$(A)"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)z", "xaybz"),
        ("$(A)$(B)", "ab"),
        ("$(EMPTY)", ""),
        ("$(UNKNOWN)", "$(UNKNOWN)"),  # unknown names stay as they are
        ("$(UNKNOWN)$(A)", "$(UNKNOWN)a"),
        ("$$(A)", "$(A)"),  # `$$` escapes: the reference is not expanded
        ("$$$(A)", "$a"),
        ("$$$$(A)", "$$(A)"),
        ("$$", "$"),
        ("a$$b", "a$b"),
        ("$", "$"),  # a trailing `$` stays
        ("a$", "a$"),
        ("$A", "$A"),  # `$` followed by anything but `$` or `(`: kept with that character
        ("${A}", "${A}"),
        ("$(A", "$(A"),  # no closing parenthesis: kept
        ("$($$", "$($"),  # ... and scanning goes on after the `$(`
        ("$()", "$()"),
        ("$(WITH SPACE)", "s"),  # the name is whatever stands before the first `)`
        ("$(A $(B)", "$(A $(B)"),
        ("$(DOLLAR)", "$(A)"),  # values are not expanded again
        ("€$(A)€", "€a€"),
        ("", ""),
    ],
)
def test_expand(text: str, expected: str) -> None:
    assert expand(text, VARS) == expected


def test_env_values_see_only_the_variables_defined_before_them() -> None:
    env = {"FIRST": "$(LATER)", "LATER": "1", "SECOND": "$(LATER)-$(FIRST)", "FIELD": "$(LATER)"}
    assert expand_env(env, literal={"FIRST", "LATER", "SECOND"}) == {
        "FIRST": "$(LATER)",
        "LATER": "1",
        "SECOND": "1-$(LATER)",
        "FIELD": "$(LATER)",  # a valueFrom value is taken as it is
    }


def test_command_args_and_env_get_the_local_values(tmp_path: Path) -> None:
    job = fake_job(
        "pass",
        args=["--node_rank=$(NODE_RANK)", "--master=$(MASTER_ADDR):$(MASTER_PORT)", "$$(NODE_RANK)", "$(NOPE)"],
        env=[{"name": "WHERE", "value": "$(KUBETRAIN_CHECKPOINT_DIR)/rank-$(NODE_RANK)"}],
    )
    nodes = local.make_plan(write_job(tmp_path, job), run_dir=tmp_path / "run").nodes(attempt=0, master_port=4242)
    assert nodes[1].argv[3:] == ["--node_rank=1", "--master=127.0.0.1:4242", "$(NODE_RANK)", "$(NOPE)"]
    assert nodes[1].env["WHERE"] == f"{(tmp_path / 'run' / 'checkpoints').resolve()}/rank-1"


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


@pytest.mark.slow
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
