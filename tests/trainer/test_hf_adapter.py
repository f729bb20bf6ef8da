"""kubetrain.runtime.guest.hf_adapter: the callback a Hugging Face Trainer gets under torchrun, its records
folded as the operator folds them, its stop, and how the torchrun hooks install it (the end-to-end
case, a GPT-2 script Ctrl-C'd under `kubetrain run --local`, is tests/local/test_hf_trainer.py)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kubetrain.api import contract, records
from kubetrain.runtime.guest import hf_adapter
from kubetrain.runtime.guest.hf_adapter import Adapter, from_logs
from kubetrain.runtime.worker import stopping

pytestmark = pytest.mark.unit


def run_python(code: str, **env: str) -> str:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("KUBETRAIN_")} | env
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180, env=environ
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_adapter_imports_only_the_standard_library() -> None:
    """Imported into a user's process as transformers.trainer loads: no pydantic, of kubetrain.api only
    its standard-library names, not even torch or transformers (a worker's callback imports kubetrain's
    stop vote later)."""
    new = json.loads(
        run_python(
            """
            import json, sys
            before = set(sys.modules)
            import kubetrain.runtime.guest.hf_adapter
            print(json.dumps(sorted(set(sys.modules) - before)))
            """
        )
    )
    heavy = [m for m in new if m.split(".")[0] in ("pydantic", "torch", "transformers", "yaml")]
    plain_api = {"kubetrain.api", "kubetrain.api.contract", "kubetrain.api.record_format"}
    assert heavy == [] and {m for m in new if m.startswith("kubetrain.api")} <= plain_api
    assert "kubetrain.runtime.guest.hf_adapter" in new


HOOKED = """
    import json, sys
    import kubetrain.runtime.torchrun_hooks
    import transformers
    imported_early = "kubetrain.runtime.guest.hf_adapter" in sys.modules
    from transformers import Trainer, TrainingArguments
    import transformers.trainer as module
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    trainer = Trainer(model=model, args=TrainingArguments(output_dir="{out}", use_cpu=True, report_to=[]))
    print(json.dumps({{
        "early": imported_early,
        "adapter": "kubetrain.runtime.guest.hf_adapter" in sys.modules,
        "defaults": [c.__name__ for c in module.DEFAULT_CALLBACKS],
        "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
    }}))
"""


def test_the_hook_adds_the_callback_once_transformers_trainer_is_imported(tmp_path: Path) -> None:
    seen = json.loads(run_python(HOOKED.format(out=tmp_path)))
    assert seen["early"] is False, "`import transformers` alone (a tokenizer script) must not import the adapter"
    assert seen["adapter"] is True
    assert seen["defaults"] == ["DefaultFlowCallback", "KubetrainCallback"]
    # After transformers' own flow callback, so its stop decision has the last word at each step.
    callbacks = seen["callbacks"]
    assert callbacks.index("DefaultFlowCallback") < callbacks.index("KubetrainCallback")


def test_kubetrain_adapters_off_leaves_the_trainer_as_it_is(tmp_path: Path) -> None:
    seen = json.loads(run_python(HOOKED.format(out=tmp_path), KUBETRAIN_ADAPTERS="off"))
    assert seen["adapter"] is False and seen["defaults"] == ["DefaultFlowCallback"]
    assert "KubetrainCallback" not in seen["callbacks"]


def test_the_names_spelled_here_are_the_contracts() -> None:
    assert hf_adapter.ATTEMPT_ENV == contract.ATTEMPT_ENV
    assert hf_adapter.CHECKPOINT_DIR_ENV == contract.CHECKPOINT_DIR_ENV
    assert hf_adapter.METRICS_FILE == records.METRICS_FILE
    assert Adapter.exit_code == stopping.EXIT_STOPPED == 143


@pytest.mark.parametrize(
    ("logs", "expected"),
    [
        ({"loss": 2.5, "grad_norm": 0.3, "learning_rate": 1e-3, "epoch": 0.25}, ("step", {"loss": 2.5, "lr": 1e-3})),
        ({"loss": 2}, ("step", {"loss": 2.0})),
        ({"eval_loss": 1.5, "eval_accuracy": 0.75, "epoch": 1.0}, ("eval", {"eval_loss": 1.5, "accuracy": 0.75})),
        ({"eval_loss": 1.5, "eval_accuracy": 7.5}, ("eval", {"eval_loss": 1.5})),  # not a fraction: not accuracy
        ({"train_runtime": 1.8, "train_loss": 4.7, "epoch": 1.25}, None),  # train()'s summary: not a step
        ({"loss": True}, None),
    ],
)
def test_a_trainer_log_makes_one_record(logs: dict[str, Any], expected: Any) -> None:
    assert from_logs(logs) == expected


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """This process as rank 0 of a torchrun world of one, its checkpoint dir `tmp_path/ckpt`; the
    signal handlers as they were afterwards."""
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KUBETRAIN_ATTEMPT", "2")
    monkeypatch.setenv("KUBETRAIN_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.delenv("KUBETRAIN_STACKS_AFTER_SECONDS", raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield tmp_path / "ckpt"
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def trainer_args(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, gradient_accumulation_steps=2, world_size=1
    )


def control() -> SimpleNamespace:
    return SimpleNamespace(should_log=False, should_save=False, should_training_stop=False)


class Left(Exception):
    """What the injected `leave` raises: the process would have ended here."""


def ending(adapter: Adapter) -> list[int]:
    codes: list[int] = []

    def leave(code: int) -> None:
        codes.append(code)
        raise Left

    adapter.leave = leave
    return codes


def save(args: SimpleNamespace, adapter: Adapter, state: SimpleNamespace) -> None:
    """What the Trainer does when control.should_save: its checkpoint folder, then on_save."""
    (Path(args.output_dir) / f"checkpoint-{state.global_step}").mkdir(parents=True)
    adapter.on_save(args, state, control())


def test_records_of_a_run_fold_into_progress_and_the_last_checkpoint(
    worker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, state, adapter = trainer_args(tmp_path), SimpleNamespace(global_step=0, max_steps=4, epoch=0.0), Adapter()
    adapter.on_train_begin(args, state, control())
    for step in range(1, 5):
        state.global_step, state.epoch = step, step / 2
        flags = control()
        adapter.on_step_end(args, state, flags)
        assert flags == control(), "no signal: the Trainer's own flow decides"
        adapter.on_log(args, state, flags, logs={"loss": 5.0 - step, "learning_rate": 0.1, "epoch": state.epoch})
        if step % 2 == 0:
            save(args, adapter, state)
    adapter.on_log(args, state, control(), logs={"eval_loss": 1.25, "eval_accuracy": 0.5})
    adapter.on_log(args, state, control(), logs={"train_runtime": 3.0, "train_loss": 2.5})
    adapter.on_train_end(args, state, control())

    out = capsys.readouterr().out
    found = records.records_in(out)
    assert [r["event"] for r in found] == [
        "start", "step", "step", "checkpoint", "step", "step", "checkpoint", "eval", "done"
    ]  # fmt: skip
    assert (worker / "metrics.jsonl").read_text() == out, "the same records, for the run's plot"
    start, step = found[0], found[1]
    assert {k: start[k] for k in ("attempt", "step", "total_steps", "epoch", "world_size", "resumed_from")} == {
        "attempt": 2, "step": 0, "total_steps": 4, "epoch": 0, "world_size": 1, "resumed_from": None
    }  # fmt: skip
    assert set(step) == {"event", "time", "attempt", "step", "total_steps", "epoch", "loss", "lr", "samples_per_s",
                         "step_time_s"}  # fmt: skip
    assert (step["step"], step["epoch"], step["loss"], step["lr"]) == (1, 0, 4.0, 0.1)
    checkpoints = [(r["step"], r["reason"], r["path"]) for r in found if r["event"] == "checkpoint"]
    assert checkpoints == [
        (2, "periodic", str(tmp_path / "out" / "checkpoint-2")),
        (4, "final", str(tmp_path / "out" / "checkpoint-4")),
    ]
    progress, last = records.fold(out)
    assert progress is not None and last is not None
    assert (progress.step, progress.total_steps, progress.percent, progress.epoch) == (4, 4, 100, 2)
    assert (progress.loss, progress.accuracy, progress.done_at is not None) == (1.0, 0.5, True)
    assert (last.path, last.step, last.reason) == (str(tmp_path / "out" / "checkpoint-4"), 4, "final")


def test_a_resumed_run_says_where_it_resumed(worker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = trainer_args(tmp_path)
    (Path(args.output_dir) / "checkpoint-30").mkdir(parents=True)
    adapter = Adapter()
    adapter.on_train_begin(args, SimpleNamespace(global_step=30, max_steps=50, epoch=1.5), control())
    adapter.stop.close()
    start, resume = records.records_in(capsys.readouterr().out)
    path = str(tmp_path / "out" / "checkpoint-30")
    assert (start["event"], start["step"], start["resumed_from"]) == ("start", 30, path)
    assert (resume["event"], resume["step"], resume["path"]) == ("resume", 30, path)


def test_a_signal_stops_at_the_next_step_saves_it_and_exits_143(
    worker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubetrain's own StopSignal (a world of one): SIGINT during step 3 -> step 3 is saved through the
    Trainer's own checkpointing, then the process ends with EXIT_STOPPED."""
    args, state, adapter = trainer_args(tmp_path), SimpleNamespace(global_step=0, max_steps=100, epoch=0.0), Adapter()
    codes = ending(adapter)
    adapter.on_train_begin(args, state, control())
    for step in (1, 2, 3):
        state.global_step = step
        if step == 3:
            signal.raise_signal(signal.SIGINT)  # the handler is the vote's: no KeyboardInterrupt
        flags = control()
        adapter.on_step_end(args, state, flags)
    assert (flags.should_log, flags.should_save, flags.should_training_stop) == (True, True, True)
    save(args, adapter, state)
    with pytest.raises(Left):
        adapter.on_epoch_end(args, state, control())
    assert codes == [143]
    captured = capsys.readouterr()
    (saved,) = [r for r in records.records_in(captured.out) if r["event"] == "checkpoint"]
    assert (saved["step"], saved["reason"]) == (3, "signal")
    assert "done" not in [r["event"] for r in records.records_in(captured.out)]
    assert "stopped at step 3 by SIGINT" in captured.err and "exiting 143" in captured.err


def test_a_signal_too_late_for_a_step_reaches_the_scripts_own_handler_after_train(
    worker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM during the final save: training is complete, so it ends normally (`done`), and the
    script's own handler gets the signal once train() is over."""
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    interrupt = signal.getsignal(signal.SIGINT)
    args, state, adapter = trainer_args(tmp_path), SimpleNamespace(global_step=0, max_steps=1, epoch=0.0), Adapter()
    adapter.on_train_begin(args, state, control())
    state.global_step = 1
    adapter.on_step_end(args, state, control())
    signal.raise_signal(signal.SIGTERM)
    assert got == [], "while training, the vote's handler holds SIGTERM"
    adapter.on_train_end(args, state, control())
    assert got == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is interrupt
    assert [r["event"] for r in records.records_in(capsys.readouterr().out)] == ["start", "done"]


def test_outside_a_torchrun_worker_it_does_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchrun's agent may import the script's modules (and so make Trainers' callbacks) before it
    forks; a plain `python train.py` is no worker either."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    before = signal.getsignal(signal.SIGINT)
    args, state, adapter = trainer_args(tmp_path), SimpleNamespace(global_step=0, max_steps=2, epoch=0.0), Adapter()
    flags = control()
    for event in ("on_init_end", "on_train_begin", "on_step_end", "on_save", "on_epoch_end", "on_train_end"):
        getattr(adapter, event)(args, state, flags)
    adapter.on_log(args, state, flags, logs={"loss": 1.0})
    assert capsys.readouterr().out == "" and flags == control() and signal.getsignal(signal.SIGINT) is before


def test_a_diverged_loss_is_null_not_invalid_json(worker: Path, tmp_path: Path) -> None:
    line: list[str] = []
    hf_adapter.Records(None, out=SimpleNamespace(write=line.append, flush=lambda: None)).write(  # type: ignore[arg-type]
        "step", step=1, loss=math.nan
    )
    assert json.loads(line[0])["loss"] is None and "NaN" not in line[0]


def test_install_appends_one_callback_class_and_leaves_an_unknown_transformers_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Base:
        pass

    class Flow(Base):
        pass

    module = SimpleNamespace(DEFAULT_CALLBACKS=[Flow], TrainerCallback=Base, PREFIX_CHECKPOINT_DIR="ckpt")
    hf_adapter.install(module)  # type: ignore[arg-type]
    hf_adapter.install(module)  # type: ignore[arg-type]
    flow, added = module.DEFAULT_CALLBACKS
    assert flow is Flow and issubclass(added, Adapter) and issubclass(added, Base) and added.prefix == "ckpt"

    other = SimpleNamespace(TrainerCallback=Base)
    hf_adapter.install(other)  # type: ignore[arg-type]
    assert "left out" in caplog.text and not hasattr(other, "DEFAULT_CALLBACKS")
