"""tests/e2e/kind-e2e.sh run against stand-ins for docker, kind, kubectl, helm and the Python
that runs the scenario: kind cannot run here, but the script's own logic can (the order of
its steps, the scenario run with the kind provider, the cluster deleted whatever happens, a
failed scenario failing the run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "tests" / "e2e" / "kind-e2e.sh"

# Every stand-in appends its command line to one file, in call order. The Python stand-in
# also records the provider the scenario would run on, and exits with $SCENARIO_EXIT; docker
# exits with $DOCKER_INFO_EXIT for `docker info`.
RECORDER = r"""
import os, sys
tool, args = sys.argv[2], sys.argv[3:]
with open(sys.argv[1], "a") as calls:
    if tool == "python" and "pytest" in args:
        calls.write(f"KUBETRAIN_E2E_PROVIDER={os.environ.get('KUBETRAIN_E2E_PROVIDER')} "
                    f"KUBETRAIN_REQUIRE_CONTROL_PLANE={os.environ.get('KUBETRAIN_REQUIRE_CONTROL_PLANE')} ")
    calls.write(" ".join([tool, *args]) + "\n")
if tool == "python" and "pytest" in args:
    sys.exit(int(os.environ.get("SCENARIO_EXIT", "0")))
if tool == "docker" and args == ["info"]:
    sys.exit(int(os.environ.get("DOCKER_INFO_EXIT", "0")))
"""


def run_script(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    (tmp_path / "recorder.py").write_text(RECORDER)
    for tool in ("docker", "kind", "kubectl", "helm", "python"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path}/recorder.py" "{calls}" {tool} "$@"\n')
        stub.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "KIND_CLUSTER": "dry",
        "PYTHON": str(bin_dir / "python"),
        **env,
    }
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    return result, calls.read_text().splitlines()


def test_builds_loads_and_runs_the_shared_scenario_on_kind(tmp_path: Path) -> None:
    result, made = run_script(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    trainer = "docker build --target trainer --build-arg TRAINER_BASE=python:3.11-slim-bookworm"
    steps = [
        "kind create cluster --name dry",
        "kubectl config use-context kind-dry",
        "docker build --target operator -t kubetrain/operator:0.1.0 .",
        f"{trainer} -t kubetrain/trainer:0.1.0-cpu .",
        "kind load docker-image --name dry kubetrain/operator:0.1.0 kubetrain/trainer:0.1.0-cpu",
        "KUBETRAIN_E2E_PROVIDER=kind KUBETRAIN_REQUIRE_CONTROL_PLANE=1 python -m pytest tests/e2e/test_cluster_e2e.py",
        "kind delete cluster --name dry",
    ]
    first = {step: next((i for i, call in enumerate(made) if call.startswith(step)), -1) for step in steps}
    assert -1 not in first.values() and list(first.values()) == sorted(first.values()), (first, made)
    # The scenario is the pytest file's, not a second copy in bash.
    assert not [call for call in made if call.startswith(("helm", "kubectl apply", "kubectl wait"))], made


@pytest.mark.parametrize(("keep", "deleted"), [("0", True), ("1", False)])
def test_a_failed_scenario_fails_the_run_and_the_cluster_goes(tmp_path: Path, keep: str, deleted: bool) -> None:
    result, made = run_script(tmp_path, SCENARIO_EXIT="1", KEEP_CLUSTER=keep)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PASS" not in result.stdout and "exit 1" in result.stdout, result.stdout
    assert ("kind delete cluster --name dry" in made) is deleted, made


def test_no_docker_daemon_is_said_before_anything_is_made(tmp_path: Path) -> None:
    result, made = run_script(tmp_path, DOCKER_INFO_EXIT="1")
    assert result.returncode == 1
    assert "FAIL: docker has no running daemon" in result.stdout, result.stdout
    assert not [call for call in made if call.startswith(("kind", "docker build"))], made
