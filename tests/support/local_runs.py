"""Helpers for the `kubetrain run --local` tests: job files in tmp_path, the CLI as a subprocess,
and waiting on a run's files with deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, TypeVar

from kubetrain.api.models import TrainingJobStatus
from kubetrain.api.records import parse_record

ROOT = Path(__file__).resolve().parents[2]
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
T = TypeVar("T")


def start_run(job_file: Path, run_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir), *args],
        cwd=cwd or ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def drain(proc: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """Read a started run's merged output in a thread, into the list returned (join the thread
    after the run ends): a run that prints faster than the test reads would block on a full pipe."""
    lines: list[str] = []
    stream = proc.stdout
    assert stream is not None

    def read() -> None:
        for line in stream:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def finish_run(job_file: Path, run_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`kubetrain run --local` to its end: the exit code and the merged output (as stdout)."""
    proc = start_run(job_file, run_dir)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def run_status(run_dir: Path) -> TrainingJobStatus:
    """A run's status.json, validated by the model of the cluster's `.status`."""
    return TrainingJobStatus.model_validate(json.loads((run_dir / "status.json").read_text()))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBETRAIN, *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "checkpoints" / "metrics.jsonl"
    if not path.exists():
        return []
    return [record for line in path.read_text().splitlines() if (record := parse_record(line)) is not None]


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def final_state(run_dir: Path) -> dict[str, Any]:
    """The newest checkpoint's saved state of a run (`state`: model, optimizer, step; `ranks`)."""
    import torch

    steps = sorted(run_dir.glob("checkpoints/step-*/meta.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    state: dict[str, Any] = torch.load(steps[-1].parent / "state.pt", weights_only=False)
    return state


def alive(pid: int, create_time: float) -> bool:
    """The process still exists and is the one we saw (not a reused PID), and is not a zombie."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_root() -> bool:
    return os.geteuid() == 0
