"""The kind end-to-end script, the scenario it runs and the workflow that runs it, checked where
they cannot run."""

from __future__ import annotations

import yaml
from support.tools import ROOT

SCRIPT = ROOT / "tests" / "e2e" / "kind-e2e.sh"
SCENARIO = ROOT / "tests" / "e2e" / "test_cluster_e2e.py"
# The scenario's helm install, shared with benchmarks/teardown_stress_pods.py.
INSTALL = ROOT / "tests" / "support" / "release.py"
WORKFLOW = ROOT / ".github" / "workflows" / "e2e.yaml"


def test_script_makes_the_cluster_and_runs_the_shared_scenario() -> None:
    """The kind steps in order, then the one scenario with the kind provider; no second copy."""
    text = SCRIPT.read_text()
    steps = [
        "kind create cluster",
        "docker build --target operator",
        "docker build --target trainer",
        "kind load docker-image",
        "KUBETRAIN_E2E_PROVIDER=kind KUBETRAIN_REQUIRE_CONTROL_PLANE=1",
        "-m pytest tests/e2e/test_cluster_e2e.py",
    ]
    positions = [text.find(step) for step in steps]
    assert all(p >= 0 for p in positions), [s for s, p in zip(steps, positions, strict=True) if p < 0]
    assert positions == sorted(positions)
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    for scenario_step in ("helm upgrade", "kubectl apply", "kubectl wait", "kubectl -n", "--for=condition="):
        assert scenario_step not in text, f"{scenario_step!r}: the scenario belongs to test_cluster_e2e.py"


def test_scenario_covers_the_issue() -> None:
    """Every step issue #11 asks of the shared scenario is there (their order is the code's)."""
    text = SCENARIO.read_text() + INSTALL.read_text()
    assert "release.install_operator(run.cluster)" in text
    steps = [
        '"upgrade", "--install"',
        '"--set", "resources.requests.cpu=0"',
        ":8000/proxy/metrics",
        ":8080/proxy/healthz",
        '"pod-security.kubernetes.io/enforce": "restricted"',
        '"apply", "-n", JOB_NS, "-f", str(DIGITS_CPU)',
        '"--for=condition=Succeeded", "trainingjob/digits-cpu"',
        'progress["accuracy"] >= 0.9',
        'status["lastCheckpoint"]',
        '"get", "tj"',
        '"Normal Created TrainingJob/digits-cpu"',
        'run.logs("digits-cpu")',
        '"--rank", "1"',
        '"delete", "pod", f"{job}-node-1"',
        '"--previous-attempt"',
        'run.logs(job, "-f"',
        '["event"] == "resume"',
        '"PodDeleted"',
    ]
    assert [step for step in steps if step not in text] == []


def test_workflow_runs_the_e2e_test() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["kind"]["steps"]
    commands = " ".join(step.get("run", "") for step in steps)
    assert "pytest" in commands and "tests/e2e" in commands
    assert "KUBETRAIN_REQUIRE_E2E" in str(workflow), "in CI a skipped e2e test must fail"
    assert '-e ".[operator,local]"' in commands, "the scenario imports kubetrain and runs `kubetrain logs`"


def test_ci_workflow_runs_the_required_suite_with_its_tools() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yaml").read_text())
    commands = " ".join(step.get("run", "") for step in workflow["jobs"]["test"]["steps"])
    assert "bash .ci/run" in commands, "CI runs the README's test command with the control plane required"
    assert "shellcheck" in commands, "test_shellcheck fails in CI without it"
