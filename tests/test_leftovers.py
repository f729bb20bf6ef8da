"""The suite fails when a process it started outlives it (tests/support/leftovers.py): shown on a
pytest of its own whose one test leaves a detached process behind, as a killed local node's
orphaned worker did."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from support.leftovers import GRACE_ENV, MARKER_ENV

pytestmark = pytest.mark.unit
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("leave", [True, False], ids=["leaves-one", "leaves-none"])
def test_a_session_that_leaves_a_process_behind_fails_and_the_process_is_killed(tmp_path: Path, leave: bool) -> None:
    pid_file = tmp_path / "orphan.pid"
    (tmp_path / "test_orphan.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys
            def test_starts_a_process():
                # Its own session, as torchrun starts a worker: nothing of the test's ends it.
                proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
                open({str(pid_file)!r}, "w").write(str(proc.pid))
                if not {leave}:
                    proc.kill()
                    proc.wait()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}  # a session of its own
    env |= {GRACE_ENV: "1", "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "support.leftovers", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    orphan = int(pid_file.read_text())
    if leave:
        assert done.returncode == 1, done.stdout[-3000:]
        assert "processes left behind" in done.stdout and f"pid {orphan}:" in done.stdout, done.stdout[-3000:]
        assert "1 passed" in done.stdout, "the test itself passed: the session fails for what it left"
    else:
        assert done.returncode == 0, done.stdout[-3000:]
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
