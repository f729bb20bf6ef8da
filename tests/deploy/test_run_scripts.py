"""The test commands, run against stand-ins: tests/run.sh installs and builds only what the chosen
tier needs, in order, then runs that tier's tests; .ci/run requires the control plane and fails a
run that collected nothing; the GitHub workflows call them as they should.

Each stand-in (install.sh, build-images.sh, the venv's python, ruff and mypy, sudo, id) appends
its name and arguments to one file, so a test reads what the script did, in order."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.tools import ROOT

pytestmark = pytest.mark.unit

# $CALLS gets "name args"; python exits $PYTEST_EXIT for pytest, tests/run.sh $RUN_EXIT; a
# stand-in for `id -u` answers $UID_IS; sudo runs its arguments.
RECORD = 'printf "%s\\n" "{name}${{*:+ $*}}" >>"$CALLS"\n'
STAND_INS = {
    "tests/cluster/install.sh": RECORD.format(name="install.sh"),
    "tests/cluster/build-images.sh": RECORD.format(name="build-images.sh") + 'echo "root=$(id -u)" >>"$CALLS"\n',
    "tests/cluster/low-torch.sh": RECORD.format(name="low-torch.sh") + 'exit "${LOW_EXIT:-0}"\n',
    "venv/bin/python": RECORD.format(name="python")
    + 'case " $* " in *" pytest "*) echo "REQUIRE=${KUBETRAIN_REQUIRE_CONTROL_PLANE:-}" >>"$CALLS"; '
    'exit "${PYTEST_EXIT:-0}";; esac\n',
    "venv/bin/ruff": RECORD.format(name="ruff"),
    "venv/bin/mypy": RECORD.format(name="mypy"),
    "bin/id": 'echo "${UID_IS:-0}"\n',
    "bin/sudo": RECORD.format(name="sudo") + 'exec "$@"\n',
}


def scratch(tmp_path: Path, *scripts: str, **stand_ins: str) -> tuple[Path, dict[str, str]]:
    """A repository holding `scripts` (copied from this one) and the stand-ins, and an env that
    finds them first."""
    repo = tmp_path / "repo"
    for script in scripts:
        (repo / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / script, repo / script)
    for path, body in {**STAND_INS, **stand_ins}.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\n" + body)
        target.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBETRAIN_")}
    env.update(PATH=f"{repo / 'bin'}:/usr/bin:/bin", CALLS=str(tmp_path / "calls"), KUBETRAIN_VENV=str(repo / "venv"))
    return repo, env


Ran = tuple[subprocess.CompletedProcess[str], list[str]]


def run(repo: Path, env: dict[str, str], *command: str, **extra: str) -> Ran:
    calls = Path(env["CALLS"])
    calls.write_text("")
    done = subprocess.run(command, cwd=repo, env={**env, **extra}, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines()


def run_sh(tmp_path: Path, *args: str, **extra: str) -> Ran:
    repo, env = scratch(tmp_path, "tests/run.sh")
    return run(repo, env, "bash", "tests/run.sh", *args, **extra)


PIP = [
    "python -m pip install -q --upgrade pip",
    "python -m pip install -q -e .[dev] --config-settings editable_mode=strict",
]
LINT = ["ruff check .", "ruff format --check .", "mypy"]


SLOWEST = "--durations=15 --durations-min=20 "  # the full run reports its slowest tests


def spread(marker: str, slowest: str = "") -> list[str]:
    return [f"python -m pytest -m {marker} -n logical --maxprocesses 4 {slowest}-x -k a b", "REQUIRE="]


def tier_run(marker: str, slowest: str = "") -> list[str]:
    """The waiting tiers: side by side on 2 workers, grouped (tests/support/worker_groups.py)."""
    waiting = "-n 2 --dist loadscope --no-loadscope-reorder"
    return [f"python -m pytest -m {marker} {waiting} {slowest}-x -k a b", "REQUIRE="]


@pytest.mark.parametrize(
    ("tier", "built", "tests"),
    [
        ("unit", [], spread("unit")),
        ("train", [], spread("train")),
        ("cluster", ["install.sh k8s helm kueue"], tier_run("cluster")),
        ("node", ["install.sh k8s node", "build-images.sh", "root=0"], tier_run("node")),
        ("e2e", ["install.sh k8s helm node", "build-images.sh", "root=0"], tier_run("e2e")),
        ("bench", ["install.sh k8s kubeflow node", "build-images.sh", "root=0"], tier_run("bench")),
        # The unit and train tiers spread over the cores, the runtime's tests on the lowest torch,
        # then every other test, side by side by module.
        (
            "all",
            ["install.sh k8s helm kueue kubeflow node", "build-images.sh", "root=0"],
            [
                *spread("unit or train", SLOWEST),
                "low-torch.sh -n logical --maxprocesses 4 -x -k a b",
                *tier_run("not unit and not train", SLOWEST),
            ],
        ),
    ],
)
def test_each_tier_builds_only_what_its_tests_use(
    tmp_path: Path, tier: str, built: list[str], tests: list[str]
) -> None:
    done, calls = run_sh(tmp_path, "--tier", tier, "-x", "-k", "a b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls == [*PIP, *built, *LINT, *tests], calls


def test_no_tier_is_the_whole_run_ci_makes(tmp_path: Path) -> None:
    _, everything = run_sh(tmp_path / "all", "--tier", "all", "-ra")
    done, default = run_sh(tmp_path / "default", "-ra")
    assert done.returncode == 0 and default == everything


def test_without_root_no_image_is_built(tmp_path: Path) -> None:
    """The tests that run the images need root too: building them (with sudo) would be wasted."""
    done, calls = run_sh(tmp_path, "--tier", "node", UID_IS="1000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [call for call in calls if call.startswith(("build-images.sh", "sudo"))], calls
    assert "images skipped: not root" in done.stdout


def test_an_unknown_tier_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done, calls = run_sh(tmp_path, "--tier", "fast")
    assert done.returncode == 2 and calls == []
    assert "unknown tier 'fast' (expected unit, train, cluster, node, e2e, bench or all)" in done.stderr


# The venv's python as a stand-in whose pytest runs exit, in turn, with the codes in $EXITS.
PYTHON_EXITING_IN_TURN = (
    RECORD.format(name="python")
    + 'case " $* " in *" pytest "*) code=$(head -n 1 "$EXITS"); sed -i 1d "$EXITS"; exit "$code";; esac\n'
)


@pytest.mark.parametrize(
    ("tier", "exits", "status"),
    [
        ("unit", "3", 3),
        ("all", "0 0 low 1", 1),
        ("all", "1 0", 1),
        ("all", "0 1", 1),
        ("all", "5 0", 0),
        ("all", "0 5", 0),
        ("all", "5 5", 5),
        ("all", "0 0", 0),
    ],
)
def test_pytests_exit_code_is_the_runs(tmp_path: Path, tier: str, exits: str, status: int) -> None:
    """A full run is two pytest runs (the unit and train tiers, the rest) and the runtime's on the lowest
    torch: the first failure is the run's, and nothing collected in one half (a -k that matches one
    side) is no failure."""
    repo, env = scratch(tmp_path, "tests/run.sh", **{"venv/bin/python": PYTHON_EXITING_IN_TURN})
    exits, _, low = exits.partition(" low ")  # the lowest torch's run (tests/cluster/low-torch.sh)
    (tmp_path / "exits").write_text(exits.replace(" ", "\n") + "\n")
    done, calls = run(
        repo, env, "bash", "tests/run.sh", "--tier", tier, EXITS=str(tmp_path / "exits"), LOW_EXIT=low or "0"
    )
    assert done.returncode == status, done.stdout + done.stderr
    assert len([call for call in calls if " -m pytest " in call]) == (1 if tier == "unit" else 2), calls


# --- .ci/run and the workflows ------------------------------------------------------------------

RUN_SH_STAND_IN = RECORD.format(name="tests/run.sh") + 'echo "REQUIRE=$KUBETRAIN_REQUIRE_CONTROL_PLANE" >>"$CALLS"\n'
RUN_SH_STAND_IN += 'echo "HOME=$HOME XDG_CACHE_HOME=$XDG_CACHE_HOME" >>"$CALLS"\nexit "${RUN_EXIT:-0}"\n'


@pytest.mark.parametrize(("pytest_exit", "ci_exit"), [(0, 0), (1, 1), (5, 1)])
def test_ci_runs_everything_with_the_control_plane_required(tmp_path: Path, pytest_exit: int, ci_exit: int) -> None:
    """pytest's 5 (no test collected) must not pass CI."""
    repo, env = scratch(tmp_path, ".ci/run", **{"tests/run.sh": RUN_SH_STAND_IN})
    done, calls = run(repo, env, "bash", ".ci/run", RUN_EXIT=str(pytest_exit))
    assert done.returncode == ci_exit
    assert calls[:2] == ["tests/run.sh -ra", "REQUIRE=1"], calls
    assert ("collected no tests" in done.stderr) is (pytest_exit == 5)


def workflow_steps(name: str) -> dict[str, str]:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return {step.get("name", ""): step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]}


def test_the_ci_workflow_runs_ci_as_root_with_the_cache_it_keeps(tmp_path: Path) -> None:
    repo, env = scratch(tmp_path, ".ci/run", **{"tests/run.sh": RUN_SH_STAND_IN})
    home = tmp_path / "home"
    done, calls = run(repo, env, "bash", "-c", workflow_steps("ci.yaml")["Test"], HOME=str(home))
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls[0].startswith("sudo env ") and calls[1:] == [
        "tests/run.sh -ra",
        "REQUIRE=1",
        f"HOME={home} XDG_CACHE_HOME={home}/.cache",
    ]


def test_the_e2e_workflow_runs_exactly_the_kind_scenario() -> None:
    [command] = [run for run in workflow_steps("e2e.yaml").values() if " -m pytest " in run]
    args = shlex.split(command.split(" -m pytest ", 1)[1])
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    tests = [line for line in collected.stdout.splitlines() if "::" in line]
    assert tests == ["tests/e2e/test_kind_e2e.py::test_kind_end_to_end"], collected.stdout + collected.stderr
