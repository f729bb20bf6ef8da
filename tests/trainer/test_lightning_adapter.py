"""kubetrain.runtime.guest.lightning_adapter: its records fold into status.progress, its stop saves the step
it stopped at as Lightning's last.ckpt, and the torchrun hook adds its callback to the Trainers of
torchrun workers only (the end-to-end runs are tests/local/test_lightning.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from kubetrain.api.records import fold, records_in
from kubetrain.runtime.guest import lightning_adapter
from kubetrain.runtime.guest.lightning_adapter import RECORD_EVERY_S, Adapter, with_callback
from kubetrain.runtime.worker.stopping import EXIT_STOPPED

pytestmark = pytest.mark.unit


class Clock(list[float]):
    """A monotonic clock the test moves: `clock[0]` is now."""

    def __init__(self) -> None:
        super().__init__([0.0])

    def __call__(self) -> float:
        return self[0]


class FakeTrainer(SimpleNamespace):
    """The public Trainer attributes the adapter reads; `save_checkpoint` as install() wraps it."""

    def __init__(self, adapter: Adapter, dirpath: Path | None, max_steps: int = 30) -> None:
        optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.25)
        checkpoint = ModelCheckpoint(dirpath=dirpath) if dirpath is not None else None
        super().__init__(
            global_rank=0,
            local_rank=0,
            world_size=1,
            max_steps=max_steps,
            estimated_stepping_batches=max_steps,
            global_step=0,
            current_epoch=0,
            optimizers=[optimizer],
            ckpt_path=None,
            checkpoint_callback=checkpoint,
            saves=[],
        )
        self.adapter = adapter

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> None:
        self.saves.append((filepath, weights_only))
        self.adapter.saved(self, filepath)


@pytest.fixture(autouse=True)
def signal_handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """StopSignal installs SIGTERM/SIGINT handlers in this (pytest's) process: put pytest's back."""
    monkeypatch.delenv("KUBETRAIN_CHECKPOINT_DIR", raising=False)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def train(adapter: Adapter, trainer: FakeTrainer, steps: int, clock: Clock, step_s: float = 0.125) -> None:
    for _ in range(steps):
        trainer.global_step += 1
        clock[0] += step_s
        adapter.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0 / trainer.global_step)}, None, 0)


def test_records_fold_into_progress_and_the_last_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    adapter = Adapter(clock=clock)
    trainer = FakeTrainer(adapter, tmp_path)
    adapter.on_train_start(trainer, None)
    train(adapter, trainer, 20, clock)
    trainer.save_checkpoint(str(tmp_path / "last.ckpt"))
    train(adapter, trainer, 10, clock)
    adapter.on_train_end(trainer, None)

    records = records_in(capsys.readouterr().out)
    assert [r["event"] for r in records if r["event"] != "step"] == ["start", "checkpoint", "done"]
    # The first step, then one a second (steps of 0.125 s): 1, 9, 17, 25 — not one a step.
    assert [r["step"] for r in records if r["event"] == "step"] == [1, 9, 17, 25]
    assert records[0]["resumed_from"] is None and records[0]["total_steps"] == 30
    progress, checkpoint = fold("\n".join(json.dumps(r) for r in records))
    assert progress is not None and checkpoint is not None
    assert (progress.step, progress.total_steps, progress.percent) == (30, 30, 100)
    assert progress.loss == pytest.approx(1 / 30) and progress.done_at is not None
    assert (checkpoint.path, checkpoint.step, checkpoint.reason) == (str(tmp_path / "last.ckpt"), 20, None)
    assert RECORD_EVERY_S == 1.0


def test_a_signal_stops_at_the_next_step_with_lightnings_last_ckpt_and_exit_143(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    adapter = Adapter(clock=clock)
    trainer = FakeTrainer(adapter, tmp_path, max_steps=1000)
    adapter.on_train_start(trainer, None)
    train(adapter, trainer, 7, clock)
    os.kill(os.getpid(), signal.SIGTERM)  # the stop's handler, not pytest's death: it only sets a flag
    with pytest.raises(SystemExit) as stopped:
        train(adapter, trainer, 5, clock)
    assert stopped.value.code == EXIT_STOPPED
    assert trainer.global_step == 8, "stopped at the first step boundary after the signal"
    assert trainer.saves == [(str(tmp_path / "last.ckpt"), False)], "the whole state, where ckpt_path='last' looks"
    captured = capsys.readouterr()
    records = records_in(captured.out)
    assert records[-1] == records[-1] | {"event": "checkpoint", "step": 8, "reason": "signal"}
    assert records[-2] == records[-2] | {"event": "step", "step": 8}, "the step it stopped at, whatever the throttle"
    assert "stopped by SIGTERM; checkpoint of step 8 written to" in captured.err
    assert adapter.state_dict() == {}, "only the stop's save says why it was made"


def test_the_stop_saves_its_reason_into_the_checkpoint_and_the_resume_record_repeats_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = Adapter()
    reasons: list[dict[str, Any]] = []
    trainer = FakeTrainer(adapter, tmp_path)
    trainer.save_checkpoint = lambda filepath, weights_only=False: reasons.append(adapter.state_dict())
    adapter.on_train_start(trainer, None)
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(SystemExit):
        train(adapter, trainer, 1, Clock())
    assert reasons == [{"reason": "signal"}]

    resumed = Adapter()
    resumed.load_state_dict(reasons[0])  # Lightning restores callbacks before training starts
    trainer = FakeTrainer(resumed, tmp_path)
    trainer.global_step, trainer.ckpt_path = 1, str(tmp_path / "last.ckpt")
    resumed.on_train_start(trainer, None)
    start, resume = records_in(capsys.readouterr().out)[-2:]
    assert start["resumed_from"] == resume["path"] == str(tmp_path / "last.ckpt")
    assert (resume["event"], resume["step"], resume["reason"]) == ("resume", 1, "signal")


def test_without_a_model_checkpoint_the_stop_saves_nothing_and_still_exits_143(
    capsys: pytest.CaptureFixture[str],
) -> None:
    adapter = Adapter()
    trainer = FakeTrainer(adapter, None)
    adapter.on_train_start(trainer, None)
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        train(adapter, trainer, 1, Clock())
    assert stopped.value.code == EXIT_STOPPED and trainer.saves == []
    assert "no ModelCheckpoint: nothing saved" in capsys.readouterr().err


def test_only_a_finished_optimizer_step_is_a_stop_boundary(tmp_path: Path) -> None:
    """Inside a gradient-accumulation window global_step stands still: no vote there, so a stop
    never saves half a window."""
    votes = []
    adapter = Adapter()
    trainer = FakeTrainer(adapter, tmp_path)
    adapter.on_train_start(trainer, None)
    adapter.stop = SimpleNamespace(agreed=lambda: votes.append(trainer.global_step) or False)
    for batch in range(6):  # accumulate_grad_batches=2: a step every other batch
        trainer.global_step = (batch + 1) // 2
        adapter.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch)
    assert votes == [1, 2, 3]


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, ["ours"]), ("cb", ["cb", "ours"]), (["a", "b"], ["a", "b", "ours"]), (("a",), ["a", "ours"])],
)
def test_the_callback_joins_the_users_callbacks_in_any_form_lightning_takes(given: Any, expected: list[str]) -> None:
    assert with_callback(given, "ours") == expected


HOOK_PROBE = """
import json, os, sys
import kubetrain.runtime.torchrun_hooks
import lightning.pytorch
import pytorch_lightning

def callbacks(package):
    trainer = package.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    return [type(callback).__name__ for callback in trainer.callbacks]

found = {"imported": "kubetrain.runtime.guest.lightning_adapter" in sys.modules, "agent": callbacks(lightning.pytorch)}
os.environ.update(RANK="0", TORCHELASTIC_RUN_ID="probe")  # what a worker forked from this process has
found["worker"] = callbacks(lightning.pytorch)
found["worker_pytorch_lightning"] = callbacks(pytorch_lightning)
print(json.dumps(found))
"""


def probe(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "TORCHELASTIC_RUN_ID", "KUBETRAIN_ADAPTERS")}
    done = subprocess.run(
        [sys.executable, "-c", HOOK_PROBE], env=clean | env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_hook_adds_the_callback_to_a_workers_trainers_of_either_package_decided_when_one_is_made() -> None:
    found = probe()
    assert found["imported"], "imported with Lightning's trainer"
    assert "KubetrainCallback" not in found["agent"], "a process that is no torchrun worker is left as it is"
    for names in (found["worker"], found["worker_pytorch_lightning"]):
        assert names.count("KubetrainCallback") == 1, names
        # Lightning's default ModelCheckpoint stays, last (Lightning's order: checkpoints after the
        # others, so a stop at a step saves before ModelCheckpoint's save of it would run).
        assert names[-1] == "ModelCheckpoint", names


def test_kubetrain_adapters_off_keeps_the_adapter_out() -> None:
    found = probe(KUBETRAIN_ADAPTERS="off")
    assert not found["imported"] and "KubetrainCallback" not in found["worker"]


def test_the_adapter_module_imports_nothing_of_kubetrain_or_torch_until_a_fit() -> None:
    """Of kubetrain.api only its standard-library names (contract, record_format); no torch, no pydantic."""
    script = (
        "import sys, kubetrain.runtime.guest.lightning_adapter\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torch', 'kubetrain.api', 'pydantic'))))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "['kubetrain.api', 'kubetrain.api.contract', 'kubetrain.api.record_format']"
    assert lightning_adapter.is_worker({"RANK": "1", "TORCHELASTIC_RUN_ID": "x"})
    assert not lightning_adapter.is_worker({"RANK": "1"})
