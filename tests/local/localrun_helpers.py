"""Helpers for the `kubetrain run --local` tests: job files in tmp_path, the CLI as a subprocess,
and waiting on a run's files with deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
DIGITS_CPU = ROOT / "examples" / "digits-cpu.yaml"
T = TypeVar("T")


def training_job(path: Path = DIGITS_CPU) -> dict[str, Any]:
    """The TrainingJob document of an example file (without the PVC next to it)."""
    return next(doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "TrainingJob")


def write_job(directory: Path, job: dict[str, Any], name: str = "job.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def digits_job(**training: Any) -> dict[str, Any]:
    """examples/digits-cpu.yaml with spec.training fields replaced."""
    job = training_job()
    job["spec"]["training"].update(training)
    return job


def fake_job(script: str, *, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    """A job whose nodes run a short Python script instead of the trainer (no torch)."""
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "fake"},
        "spec": {"nodes": nodes, "command": [sys.executable, "-c", script], **spec},
    }


def start_run(job_file: Path, run_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir), *args],
        cwd=cwd or ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBETRAIN, *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for(what: str, check: Callable[[], T | None], timeout: float, proc: subprocess.Popen[str] | None = None) -> T:
    """Poll `check` until it returns a value; fail at the deadline or when `proc` ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"waiting for {what}: the run exited with {proc.returncode}\n{out[-4000:]}")
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "checkpoints" / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


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
