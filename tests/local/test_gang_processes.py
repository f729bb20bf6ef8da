"""Gang semantics with small fake node commands (no torch): restarts, backoff, deadline, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from support.jobs import fake_job, write_job
from support.local_runs import KUBETRAIN, alive, finish_run, start_run, summary
from support.waiting import wait_for

pytestmark = pytest.mark.unit


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_failing_node_restarts_the_gang_until_max_restarts(tmp_path: Path) -> None:
    # Node 1 fails at once; node 0 would run for a minute, so each failure must stop it.
    script = "import os, sys, time\nif os.environ['NODE_RANK'] == '1': sys.exit(3)\ntime.sleep(60)"
    job = fake_job(script, runPolicy={"maxRestarts": 2})
    done = finish_run(write_job(tmp_path, job), tmp_path / "run")
    assert done.returncode == 1, done.stdout
    result = summary(tmp_path / "run")
    assert (result["reason"], result["restarts"], result["attempts"]) == ("BackoffLimitExceeded", 2, 3)
    assert [f["rank"] for f in result["failures"]] == [1, 1, 1]
    assert [f["exitCode"] for f in result["failures"]] == [3, 3, 3]
    assert result["nodeExitCodes"] == [-signal.SIGTERM, 3]
    assert (tmp_path / "run" / "node-0.log").read_text().count("=== kubetrain: attempt") == 3
    assert "(restart 2 of 2)" in done.stdout


def test_a_node_that_fails_once_is_restarted_and_the_run_succeeds(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        marker = pathlib.Path({str(marker)!r})
        if os.environ['NODE_RANK'] == '1' and not marker.exists():
            marker.touch()
            sys.exit(1)
        print('attempt ok', os.environ['NODE_RANK'])
        """
    )
    done = finish_run(write_job(tmp_path, fake_job(script)), tmp_path / "run")
    assert done.returncode == 0, done.stdout
    result = summary(tmp_path / "run")
    assert (result["outcome"], result["restarts"], result["nodeExitCodes"]) == ("Succeeded", 1, [0, 0])
    assert "[node-1] attempt ok 1" in done.stdout


def test_active_deadline_stops_every_node(tmp_path: Path) -> None:
    job = fake_job("import time; time.sleep(120)", runPolicy={"activeDeadlineSeconds": 2})
    proc = start_run(write_job(tmp_path, job), tmp_path / "run")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert summary(tmp_path / "run")["reason"] == "DeadlineExceeded"
    pids = json.loads((tmp_path / "run" / "pids.json").read_text())["pids"]
    assert not [pid for pid in pids if running(pid)]


def interrupt_a_run_of_two_trees(tmp_path: Path, script: str) -> list[int]:
    """Run 2 nodes of `script` (each starting one child), SIGINT the run once all 4 processes
    exist, and return the PIDs of those that outlived it (killed here, so nothing leaks)."""
    proc = start_run(write_job(tmp_path, fake_job(script)), tmp_path / "run")
    me = psutil.Process(proc.pid)

    def tree_of_four() -> list[psutil.Process] | None:
        kids = me.children(recursive=True)
        return kids if len(kids) >= 4 else None

    tree = wait_for(tree_of_four, 60, "2 nodes with a child each", proc=proc)
    seen = [(p.pid, p.create_time()) for p in tree]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out
    left = [pid for pid, created in seen if alive(pid, created)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_sigint_stops_whole_node_trees(tmp_path: Path) -> None:
    # Each node starts a grandchild, as torchrun starts workers, then both wait.
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(120)'])
        print('ready', flush=True)
        time.sleep(120)
        """
    )
    left = interrupt_a_run_of_two_trees(tmp_path, script)
    assert not left, "a node's child outlived the run"
    assert summary(tmp_path / "run")["outcome"] == "Interrupted"


def test_a_successful_run_leaves_no_process_behind(tmp_path: Path) -> None:
    # Each node leaves a background child running and exits 0 (a pod's container would take
    # such a child with it when the pod finishes).
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        child = subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(120)'])
        print('child', child.pid, flush=True)
        """
    )
    done = finish_run(write_job(tmp_path, fake_job(script)), tmp_path / "run")
    assert done.returncode == 0, done.stdout
    children = [int(line.split()[-1]) for line in done.stdout.splitlines() if "] child " in line]
    assert len(children) == 2, done.stdout
    assert not [pid for pid in children if running(pid)]


def test_runs_started_in_the_same_second_get_their_own_run_dirs(tmp_path: Path) -> None:
    # The default run dir is named to the second; a shared one would mix two runs' checkpoints.
    job_file = write_job(tmp_path, fake_job("pass", nodes=1))
    procs = [
        subprocess.Popen([KUBETRAIN, "run", str(job_file), "--local"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outs
    dirs = sorted((tmp_path / "runs").iterdir())
    assert len(dirs) == 3 and all((d / "summary.json").exists() for d in dirs), dirs


def test_sigint_stops_workers_in_sessions_of_their_own(tmp_path: Path) -> None:
    # As torchrun does, each node starts its worker in a new session; this worker also ignores
    # SIGTERM, so only the supervisor's SIGKILL of the worker's own group can end it.
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([{sys.executable!r}, '-c', {worker!r}], start_new_session=True)
        time.sleep(120)
        """
    )
    left = interrupt_a_run_of_two_trees(tmp_path, script)
    assert not left, "a worker outlived the run"
