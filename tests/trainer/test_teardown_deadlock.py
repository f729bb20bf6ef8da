"""pytorch/pytorch#56297 on demand (benchmarks/teardown_deadlock.py): two gloo ranks drop a large
all-reduce while it is in flight, then tear down.

- With the torch the tests and the trainer image use, `destroy_process_group()` returns and so does
  the built-in trainer's exit (barrier, then `os._exit`): the train tier runs this.
- With torch 2.7.1, the image's torch before issue #22, `destroy_process_group()` deadlocks in
  `~ProcessGroupGloo()` every time, with the stacks of the issue, while the trainer's exit still
  returns. That venv is ~3 GB of CUDA wheels, too heavy for CI, so the test runs only where it
  exists (it is skipped elsewhere, never passed): create it with
      python3 -m venv ~/.cache/kubetrain/venv-torch-2.7.1
      ~/.cache/kubetrain/venv-torch-2.7.1/bin/pip install torch==2.7.1 numpy py-spy
  benchmarks/results/teardown_deadlock.json holds the counts of 10 trials of each variant.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from support.benchmarks import run_benchmark
from support.controlplane import cache_dir

pytestmark = pytest.mark.train
ROOT = Path(__file__).resolve().parents[2]
OLD_TORCH = cache_dir() / "venv-torch-2.7.1" / "bin" / "python"


def trials(python: Path | str, teardowns: str, output: Path) -> dict[str, dict[str, Any]]:
    """One trial of each teardown; variant name -> its summary and trials."""
    options = ("--python", str(python), "--teardowns", teardowns, "--trials", "1")
    result = run_benchmark("teardown_deadlock.py", output, *options, timeout=1500)
    return {v["teardown"]: v for v in result["variants"]}


def test_shipped_torch_returns_from_destroy_and_from_the_trainers_exit(tmp_path: Path) -> None:
    found = trials(sys.executable, "destroy,barrier-exit", tmp_path / "shipped.json")
    for teardown in ("destroy", "barrier-exit"):
        (trial,) = found[teardown]["trials"]
        assert not trial["hung"] and trial["exit_codes"] == [0, 0], trial
        assert trial["last_stage"] == ["teardown-returned", "teardown-returned"], trial


def test_old_torch_deadlocks_in_destroy_but_not_in_the_trainers_exit(tmp_path: Path) -> None:
    if not OLD_TORCH.exists():
        pytest.skip(f"no torch 2.7.1 venv at {OLD_TORCH.parent.parent} (module docstring: how to make it)")
    found = trials(OLD_TORCH, "destroy,barrier-exit", tmp_path / "old.json")
    assert found["destroy"]["torch"] == "2.7.1"
    (hung,) = found["destroy"]["trials"]
    assert hung["hung_ranks"] == [0, 1], hung
    stacks = "\n".join(rank["py-spy"] for rank in hung["stacks"].values())
    # The deadlock: the main thread joins a gloo thread in the destructor, and that thread
    # waits for the GIL to free a tensor's Python object.
    for frame in ("ProcessGroupGloo::~ProcessGroupGloo", "std::thread::join", "gil_scoped_acquire"):
        assert frame in stacks, stacks
    (left,) = found["barrier-exit"]["trials"]
    assert not left["hung"] and left["exit_codes"] == [0, 0], left
