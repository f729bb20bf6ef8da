"""The test tiers (tests/support/tiers.py): a test with no tier or two, a unit or train test that
asks for a control plane, or a slow unit test, stops the collection naming it, whatever `-m`
selects; `pytest --markers` lists the tiers; under KUBETRAIN_REQUIRE_CONTROL_PLANE=1 a skipped
test above `unit` and `train` fails. Checked on planted test files run by a pytest of their own,
with tests/conftest.py as plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.tiers import TIERS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PLANTED = textwrap.dedent(
    """
    import pytest

    def test_untiered():
        pass

    @pytest.mark.unit
    @pytest.mark.cluster
    def test_two_tiers():
        pass

    @pytest.mark.unit
    def test_unit_asking_for_a_control_plane(control_plane):
        pass

    @pytest.mark.unit
    @pytest.mark.slow
    def test_unit_that_trains():
        pass

    @pytest.mark.train
    def test_train_asking_for_a_namespace(namespace):
        pass

    @pytest.mark.unit
    def test_fine():
        pass
    """
)


def pytest_in(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest on `folder` alone with the project's conftest as a plugin, the markers declared in
    an ini of its own, and only `env`'s KUBETRAIN_REQUIRE_* variables."""
    markers = "".join(f"    {marker}: planted\n" for marker in (*TIERS, "slow"))
    ini = folder / "pytest.ini"
    ini.write_text(f"[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n{markers}")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KUBETRAIN_REQUIRE")}
    environ.update(PYTHONPATH=str(ROOT / "tests"), **env)
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-c", str(ini), "--rootdir", str(folder), *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120, env=environ)


@pytest.mark.parametrize("select", [[], ["-m", "unit"], ["-m", "cluster"]], ids=["all", "unit", "cluster"])
def test_a_test_without_exactly_one_tier_stops_the_collection(tmp_path: Path, select: list[str]) -> None:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    result = pytest_in(tmp_path, "--collect-only", "-q", *select)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    named = {line.strip() for line in result.stderr.splitlines() if "test_planted.py::" in line}
    assert named == {
        "test_planted.py::test_untiered: no tier",
        "test_planted.py::test_two_tiers: tiers unit, cluster",
        "test_planted.py::test_unit_asking_for_a_control_plane: unit, but uses control_plane",
        "test_planted.py::test_unit_that_trains: unit, but slow (real multi-process training is the train tier)",
        "test_planted.py::test_train_asking_for_a_namespace: train, but uses control_plane, kube_api, namespace",
    }, result.stderr


def test_a_suite_whose_tests_have_one_tier_each_collects(tmp_path: Path) -> None:
    fine = PLANTED.split("@pytest.mark.unit\ndef test_fine", 1)[1]
    (tmp_path / "test_planted.py").write_text("import pytest\n\n@pytest.mark.unit\ndef test_fine" + fine)
    result = pytest_in(tmp_path, "--collect-only", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_planted.py::test_fine" in result.stdout


def test_pytest_lists_the_tiers() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    listed = {line.split(":", 1)[0] for line in result.stdout.splitlines() if line.startswith("@pytest.mark.")}
    assert {f"@pytest.mark.{marker}" for marker in (*TIERS, "slow")} <= listed


SKIPPING = textwrap.dedent(
    """
    import pytest

    @pytest.mark.unit
    def test_unit_skips():
        pytest.skip("not here")

    @pytest.mark.train
    def test_train_skips():
        pytest.skip("no GPU")

    @pytest.mark.cluster
    def test_cluster_skips():
        pytest.skip("no control plane")

    @pytest.mark.bench
    def test_bench_skips():
        pytest.skip("no peer")
    """
)


KIND = 'REQUIRE_ENV = "KUBETRAIN_REQUIRE_E2E"\n'
ABOVE_UNIT = {"test_cluster_skips", "test_bench_skips"}


@pytest.mark.parametrize(
    ("env", "module_env", "failed"),
    [
        ({}, "", set()),
        ({"KUBETRAIN_REQUIRE_CONTROL_PLANE": "1"}, "", ABOVE_UNIT),
        # The kind scenario names its own variable: CI's does not apply to it, its own does.
        ({"KUBETRAIN_REQUIRE_CONTROL_PLANE": "1"}, KIND, set()),
        ({"KUBETRAIN_REQUIRE_E2E": "1"}, KIND, ABOVE_UNIT),
    ],
    ids=["free", "required", "kind-not-required", "kind-required"],
)
def test_required_runs_fail_a_skip_above_unit(
    tmp_path: Path, env: dict[str, str], module_env: str, failed: set[str]
) -> None:
    (tmp_path / "test_skipping.py").write_text(module_env + SKIPPING)
    result = pytest_in(tmp_path, "-q", "-rfs", **env)
    outcomes = {line.split("::")[-1].split(" ")[0] for line in result.stdout.splitlines() if line.startswith("FAILED")}
    assert outcomes == failed, result.stdout
    assert result.returncode == (1 if failed else 0), result.stdout
