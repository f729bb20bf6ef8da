"""The kind end-to-end script and the workflow that runs it, checked where they cannot run."""

from __future__ import annotations

import subprocess

import yaml
from support.tools import ROOT, missing_tool, which

SCRIPT = ROOT / "tests" / "e2e" / "kind-e2e.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "e2e.yaml"


def test_shellcheck() -> None:
    shellcheck = which("shellcheck")
    if shellcheck is None:
        missing_tool("shellcheck not found: apt-get install -y shellcheck")
    assert shellcheck is not None
    result = subprocess.run(
        [shellcheck, "--severity=style", "--shell=bash", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_covers_the_issue() -> None:
    """The steps the issue asks for, in order."""
    text = SCRIPT.read_text()
    steps = [
        "kind create cluster",
        "docker build --target operator",
        "docker build --target trainer",
        "kind load docker-image",
        "helm upgrade --install",
        "apply -f examples/digits-cpu.yaml",
        "--for=condition=Succeeded trainingjob/digits-cpu",
        ".status.progress.percent",
        "logs digits-cpu-node-0",
        "delete pod digits-restart-node-1",
        "wait_for_at_least digits-restart .status.restarts 1",
        '"event":"resume","time"',
    ]
    positions = [text.find(step) for step in steps]
    assert all(p >= 0 for p in positions), [s for s, p in zip(steps, positions, strict=True) if p < 0]
    assert positions == sorted(positions)
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text


def test_workflow_runs_the_e2e_test() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["kind"]["steps"]
    commands = " ".join(step.get("run", "") for step in steps)
    assert "pytest" in commands and "tests/e2e" in commands
    assert "KUBETRAIN_REQUIRE_E2E" in str(workflow), "in CI a skipped e2e test must fail"


def test_ci_workflow_runs_the_required_suite_with_its_tools() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yaml").read_text())
    commands = " ".join(step.get("run", "") for step in workflow["jobs"]["test"]["steps"])
    assert "bash .ci/run" in commands, "CI runs the README's test command with the control plane required"
    assert "shellcheck" in commands, "test_shellcheck fails in CI without it"
