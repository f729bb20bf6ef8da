"""tests/e2e/kind-e2e.sh run against stand-ins for docker, kind, kubectl and helm: kind cannot
run here, but the script's own logic can (set -euo pipefail traps, the order of the steps, and
that each check really fails the run when the cluster says otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import ROOT

SCRIPT = ROOT / "tests" / "e2e" / "kind-e2e.sh"

# kubectl's answers: TrainingJob fields by (job, jsonpath), and pod logs.
HEALTHY: dict[str, object] = {
    "fields": {
        "digits-cpu": {
            ".status.phase": "Succeeded",
            ".status.progress.percent": "100",
            ".status.progress.step": "264",
            ".status.progress.totalSteps": "264",
            ".status.progress.loss": "0.08",
            ".status.restarts": "0",
        },
        "digits-restart": {
            ".status.phase": "Running",
            ".status.restarts": "1",
            ".status.attempt": "1",
            ".status.failures[0].reason": "PodDeleted",
            ".status.progress.percent": "100",
        },
    },
    "logs": {
        "digits-cpu-node-0": '{"event":"start","time":1.0,"step":0}\n{"event":"step","time":1.5,"step":5}\n',
        "digits-restart-node-0": (
            '{"event":"checkpoint","time":2.0,"step":40,"epoch":1}\n'
            '{"event":"checkpoint","time":3.0,"step":80,"epoch":3}\n'
            '{"event":"resume","time":9.0,"step":80,"epoch":3,"path":"/checkpoints/step-80"}\n'
        ),
    },
}

KUBECTL = r"""
import json, re, sys
state = json.load(open(sys.argv[1]))
args = sys.argv[2:]
with open(sys.argv[1] + ".calls", "a") as calls:
    calls.write("kubectl " + " ".join(args) + "\n")
if "get" in args and "trainingjob" in args:
    job = args[args.index("trainingjob") + 1]
    path = next(a for a in args if a.startswith("jsonpath="))[len("jsonpath={"):-1]
    print(state["fields"].get(job, {}).get(path, ""), end="")
elif "logs" in args:
    pod = next(a for a in args if a in state["logs"])
    print(state["logs"][pod], end="")
elif args[:2] == ["create", "namespace"]:
    print("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: e2e")
elif "apply" in args:
    sys.stdin.read()
"""

RECORDER = r"""
import sys
with open(sys.argv[1] + ".calls", "a") as calls:
    calls.write(" ".join(sys.argv[2:]) + "\n")
"""


def run_script(tmp_path: Path, state: dict[str, object]) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    (tmp_path / "kubectl.py").write_text(KUBECTL)
    (tmp_path / "recorder.py").write_text(RECORDER)
    for tool in ("docker", "kind", "helm"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path}/recorder.py" "{state_file}" {tool} "$@"\n')
        stub.chmod(0o755)
    stub = bin_dir / "kubectl"
    stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path}/kubectl.py" "{state_file}" "$@"\n')
    stub.chmod(0o755)
    # `sleep` stays real; the script sleeps 1-2 s per poll and these answers end every poll at once.
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "KIND_CLUSTER": "dry"}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "state.json.calls").read_text().splitlines()


def test_passes_when_the_cluster_behaves(tmp_path: Path) -> None:
    result = run_script(tmp_path, HEALTHY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed at step 80 (checkpoint seen before the kill: step 80)" in result.stdout
    made = calls(tmp_path)
    first = {prefix: next(i for i, c in enumerate(made) if c.startswith(prefix)) for prefix in (
        "kind create cluster --name dry",
        "docker build --target operator -t kubetrain/operator:0.1.0",
        "docker build --target trainer --build-arg TRAINER_BASE=python:3.11-slim-bookworm -t kubetrain/trainer:0.1.0-c",
        "kind load docker-image --name dry kubetrain/operator:0.1.0 kubetrain/trainer:0.1.0-cpu",
        "helm upgrade --install kubetrain charts/kubetrain",
        "kubectl -n e2e wait --for=condition=Succeeded trainingjob/digits-cpu",
        "kubectl -n e2e delete pod digits-restart-node-1",
        "kubectl -n e2e wait --for=condition=Succeeded trainingjob/digits-restart",
        "kind delete cluster --name dry",
    )}  # fmt: skip
    assert list(first.values()) == sorted(first.values()), first


@pytest.mark.parametrize(
    ("job", "field", "value", "message"),
    [
        ("digits-cpu", ".status.progress.percent", "90", "status.progress.percent is '90'"),
        ("digits-cpu", ".status.restarts", "1", "digits-cpu restarted without a failure"),
        ("digits-restart", ".status.failures[0].reason", "Error", "expected PodDeleted"),
        ("digits-restart", ".status.phase", "Succeeded", "finished before it could be interrupted"),
    ],
)
def test_fails_when_the_cluster_does_not(tmp_path: Path, job: str, field: str, value: str, message: str) -> None:
    state = json.loads(json.dumps(HEALTHY))
    state["fields"][job][field] = value
    result = run_script(tmp_path, state)
    assert result.returncode != 0
    assert message in result.stdout, result.stdout + result.stderr


def test_fails_without_a_resume_record(tmp_path: Path) -> None:
    state = json.loads(json.dumps(HEALTHY))
    state["logs"]["digits-restart-node-0"] = '{"event":"checkpoint","time":2.0,"step":40}\n'
    result = run_script(tmp_path, state)
    assert result.returncode != 0
    assert "did not resume from the checkpoint at step 40" in result.stdout
