"""Bad input: exit code 2, a message naming the field, and nothing started."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from support.jobs import fake_job, write_job
from support.local_runs import run_cli
from typer.testing import CliRunner

from kubetrain.cli.main import app

pytestmark = pytest.mark.unit

# Every job's nodes would create this file if anything started.
MARKER = "started"


def job_with(path: str, value: Any, marker: Path) -> dict[str, Any]:
    job = fake_job(f"open({str(marker)!r}, 'a').close()")
    node = job
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = copy.deepcopy(value)
    return job


# (case id, dotted path, value, extra CLI args, text the message must contain)
CASES: list[tuple[str, str | None, Any, list[str], str]] = [
    ("unknown-field", "spec.gpus", 2, [], "spec.gpus: unknown field"),
    ("unknown-training-field", "spec.training.lr", 0.1, [], "spec.training.lr: unknown field"),
    ("nodes-zero", "spec.nodes", 0, [], "spec.nodes"),
    ("gpus-negative", "spec.gpusPerNode", -1, [], "spec.gpusPerNode"),
    ("reserved-env", "spec.env", [{"name": "MASTER_ADDR", "value": "x"}], [], "'MASTER_ADDR' is reserved"),
    ("reserved-prefix", "spec.env", [{"name": "KUBETRAIN_FOO", "value": "x"}], [], "'KUBETRAIN_FOO' is reserved"),
    (
        "reserved-checkpoint-dir",
        "spec.env",
        [{"name": "KUBETRAIN_CHECKPOINT_DIR", "value": "/elsewhere"}],
        [],
        "'KUBETRAIN_CHECKPOINT_DIR' is reserved",
    ),
    ("nccl-on-cpu", "spec.backend", "nccl", [], "backend"),
    ("bad-name", "metadata.name", "Digits_CPU", [], "metadata.name"),
    ("override-nodes-zero", None, None, ["--nodes", "0"], "spec.nodes"),
    ("override-gpus-negative", None, None, ["--gpus-per-node", "-1"], "spec.gpusPerNode"),
    (
        "secret-env",
        "spec.env",
        [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        [],
        "spec.env: TOKEN",
    ),
    ("command-missing", "spec.command", ["no-such-program-kt"], [], "spec.command: 'no-such-program-kt' not found"),
    ("too-many-gpus", None, None, ["--gpus-per-node", "16"], "spec.gpusPerNode"),
    ("suspended", "spec.runPolicy", {"suspend": True}, [], "spec.runPolicy.suspend"),
]


@pytest.mark.parametrize(("path", "value", "args", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_field(
    path: str | None, value: Any, args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # too-many-gpus: a machine with no GPUs
    marker = tmp_path / MARKER
    job = job_with(path, value, marker) if path else job_with("spec.nodes", 2, marker)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", str(write_job(tmp_path, job)), "--local", "--run-dir", str(run_dir), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not run_dir.exists(), "a run directory was created for bad input"
    assert not marker.exists(), "a node process started for bad input"


def test_missing_file_and_missing_local(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(tmp_path / "nope.yaml"), "--local"])
    assert result.exit_code == 2 and "No such file" in result.output
    result = CliRunner().invoke(app, ["run", "job.yaml"])
    assert result.exit_code == 2 and "kubectl apply -f job.yaml" in result.output and "--local" in result.output


def test_the_real_command_exits_2(tmp_path: Path) -> None:
    marker = tmp_path / MARKER
    done = run_cli("run", str(write_job(tmp_path, job_with("spec.nodes", 0, marker))), "--local", cwd=tmp_path)
    assert done.returncode == 2
    assert "spec.nodes" in done.stderr
    assert not (tmp_path / "runs").exists() and not marker.exists()
