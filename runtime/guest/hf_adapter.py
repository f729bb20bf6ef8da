"""A Hugging Face `Trainer` script under torchrun gets what the built-in trainer has, the script
unchanged: progress records, a `checkpoint` record for each of its saves, the zero-loss stop and
the hang watchdog.

kubetrain's torchrun hooks call `install` once `transformers.trainer` is imported (and import
this module only then): it appends a callback class to that module's `DEFAULT_CALLBACKS`, the
list every `Trainer.__init__` starts its callbacks from, after transformers' own
`DefaultFlowCallback`. The hook may fire in torchrun's agent before it forks the workers
(runtime/agent/warmstart.py), so nothing is decided at install: each callback finds out at run time
whether its process is a torchrun worker (RANK and TORCHELASTIC_RUN_ID set) and does nothing
otherwise. In a worker:

* rank 0 prints `start` (and `resume`, where the Trainer resumed a checkpoint) at train begin,
  a `step` record at each of the Trainer's logs (`loss`, `lr`), `eval` for an evaluation's,
  `checkpoint` after each save (its `checkpoint-N` folder, reason `periodic`, `final` or
  `signal`) and `done` at the end: kubetrain.api.records' format, on stdout and appended to
  `$KUBETRAIN_CHECKPOINT_DIR/metrics.jsonl` (else the Trainer's `output_dir`);
* every rank beats the hang watchdog at each optimizer step (kubetrain.runtime.worker.watchdog);
* SIGTERM or SIGINT to any rank becomes a stop at one step boundary, every rank agreeing
  (kubetrain.runtime.worker.stopping: its vote is collective, called at each `on_step_end`): that step
  is saved by the Trainer's own checkpointing (`should_save`, `should_training_stop`), and once
  the save is done every rank meets and exits EXIT_STOPPED (143). A script that resumes from
  `get_last_checkpoint(output_dir)` loses no step.

Only public transformers names are used (`DEFAULT_CALLBACKS`, `TrainerCallback`,
`PREFIX_CHECKPOINT_DIR`, the callback events and `TrainerControl`'s flags); where one is missing
the adapter is left out with a warning and the Trainer runs as without kubetrain. Set
KUBETRAIN_ADAPTERS=off in the process's environment to leave the adapters out
(kubetrain.runtime.torchrun_hooks).

This module imports only the standard library at import time: kubetrain's stop vote, process
group and watchdog (which import torch and kubetrain.api) are imported by a worker's callback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from kubetrain.runtime.guest import guest_records

log = logging.getLogger("kubetrain.hf_adapter")

# kubetrain.api.contract's and kubetrain.api.record_format's names.
ATTEMPT_ENV = guest_records.ATTEMPT_ENV
CHECKPOINT_DIR_ENV = guest_records.CHECKPOINT_DIR_ENV
METRICS_FILE = guest_records.METRICS_FILE


class Records:
    """Rank 0's metrics records: one JSON object per line on `out` (stdout), and appended to
    `<directory>/metrics.jsonl`, which `kubetrain run --local`'s plot reads."""

    def __init__(self, directory: str | Path | None, out: TextIO | None = None) -> None:
        self.directory = directory
        self.out = out

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        return guest_records.write(event, out=self.out, directory=self.directory, **fields)


def position(state: Any) -> dict[str, int]:
    """`step`, `total_steps` and the 0-based `epoch` of a TrainerState (its epoch is fractional)."""
    return {"step": int(state.global_step), "total_steps": int(state.max_steps), "epoch": int(state.epoch or 0)}


def from_logs(logs: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The record one of the Trainer's logs makes: `step` for a training log (`loss`,
    `learning_rate`), `eval` for an evaluation's (`eval_loss`, `eval_accuracy`), None for any other
    (the summary a finished `train()` logs)."""

    def number(key: str) -> float | None:
        value = logs.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    if (loss := number("loss")) is not None:
        lr = number("learning_rate")
        return "step", {"loss": loss} if lr is None else {"loss": loss, "lr": lr}
    if (eval_loss := number("eval_loss")) is not None:
        fields: dict[str, Any] = {"eval_loss": eval_loss}
        if (accuracy := number("eval_accuracy")) is not None and 0 <= accuracy <= 1:
            fields["accuracy"] = accuracy
        return "eval", fields
    return None


def checkpoint_path(output_dir: str, prefix: str, step: int) -> str:
    """The folder the Trainer saves step `step` in (`<output_dir>/checkpoint-<step>`), absolute."""
    return os.path.abspath(os.path.join(output_dir, f"{prefix}-{step}"))


def save_reason(state: Any, stopping: bool) -> str:
    if stopping:
        return "signal"
    return "final" if state.max_steps and state.global_step >= state.max_steps else "periodic"


class Adapter:
    """The callback's behaviour; `install` mixes it into a TrainerCallback class. One instance
    per Trainer; it acts only in a torchrun worker, from its `on_train_begin` on."""

    prefix = "checkpoint"
    # kubetrain.runtime.worker.stopping.EXIT_STOPPED (imported with torch, so not at import time here).
    exit_code = 128 + signal.SIGTERM

    def __init__(self) -> None:
        self.active = False
        self.rank = 0
        self.records: Records | None = None
        self.stop: Any = None
        self.watchdog: Any = None
        self.stopping = False
        self.stop_saved: str | None = None
        self.last_loss: float | None = None
        self.last_accuracy: float | None = None
        self.window: tuple[float, int] = (time.monotonic(), 0)
        self.handlers: dict[int, Any] = {}
        self.leave: Callable[[int], Any] = _leave

    # -- events ------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer exists, so does the process group its TrainingArguments set up: rank 0
        marks the rendezvous an attempt's timeline and an in-place restart count by (a script's
        own init_process_group leaves it to the adapter, kubetrain.runtime.guest.step_watch)."""
        guest_records.rendezvous()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not guest_records.is_worker():
            return
        from kubetrain.runtime.worker.stopping import EXIT_STOPPED
        from kubetrain.runtime.worker.watchdog import HangWatchdog

        self.active, self.stopping, self.stop_saved = True, False, None
        self.rank = int(os.environ["RANK"])
        self.exit_code = EXIT_STOPPED
        if self.rank == 0:
            self.records = Records(os.environ.get(CHECKPOINT_DIR_ENV) or args.output_dir)
        self.watchdog = HangWatchdog(int(os.environ.get("LOCAL_RANK", "0") or 0))
        self.watchdog.beat()
        self.handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.stop = _stop_signal()  # collective with NCCL (its gloo group): every rank is here
        self.window = (time.monotonic(), int(state.global_step))
        world = guest_records.world() or (1, "none")
        resumed = None
        if state.global_step > 0:
            found = checkpoint_path(args.output_dir, self.prefix, int(state.global_step))
            resumed = found if os.path.isdir(found) else None
        self._write("start", state, world_size=world[0], backend=world[1], resumed_from=resumed)
        if resumed is not None:
            self._write("resume", state, path=resumed)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        self.watchdog.beat()
        if not self.stopping and self.stop.agreed():
            # Every rank got the same answer at this step: the Trainer logs it, saves it through
            # its own checkpointing (on_save follows) and leaves its loop.
            self.stopping = True
            control.should_log = control.should_save = control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not self.active or self.records is None or not logs or (made := from_logs(logs)) is None:
            return
        event, fields = made
        if event == "step":
            self.last_loss = fields["loss"]
            fields.update(self._rates(args, int(state.global_step)))
        elif "accuracy" in fields:
            self.last_accuracy = fields["accuracy"]
        self._write(event, state, **fields)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        path = checkpoint_path(args.output_dir, self.prefix, int(state.global_step))
        if self.stopping:
            self.stop_saved = path
        if os.path.isdir(path):  # rank 0 saved it (the other ranks' RNG states are in it too)
            self._write("checkpoint", state, path=path, reason=save_reason(state, self.stopping))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer left its loop after the stop's save; what follows (an evaluation or a save
        # at the epoch's end, the run's summary) is not worth a stopping pod's grace period.
        if self.active and self.stopping:
            self._exit(state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        if self.stopping:
            self._exit(state)
            return
        self.active = False
        self.stop.close()
        self.watchdog.stop()
        self._write("done", state, loss=self.last_loss, accuracy=self.last_accuracy)
        # The script's code after train() gets the handlers it had; a signal that came too late
        # to stop at a step (during the final save) is delivered to them now.
        received = self.stop.received
        for sig, handler in self.handlers.items():
            if handler is not None:  # None: a handler not set from Python, which Python cannot restore
                signal.signal(sig, handler)
        if received is not None:
            signal.raise_signal(received)

    # -- helpers -----------------------------------------------------------------------------

    def _write(self, event: str, state: Any, **fields: Any) -> None:
        if self.records is None:
            return
        try:
            self.records.write(event, **position(state), **fields)
        except OSError:  # a guest in the user's process: its training goes on without the file
            log.warning("kubetrain could not write its %s record", event, exc_info=True)
            self.records.directory = None

    def _rates(self, args: Any, step: int) -> dict[str, float]:
        """Samples/s (global) and s/step since the previous log: the progress bar's rate."""
        started, first = self.window
        now = time.monotonic()
        self.window = (now, step)
        steps = step - first
        if steps <= 0 or now <= started:
            return {}
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        return {"samples_per_s": steps * batch / (now - started), "step_time_s": (now - started) / steps}

    def _exit(self, state: Any) -> None:
        """Every rank meets (the stop's save is complete once all passed), then the process ends
        with EXIT_STOPPED, as the built-in trainer ends: without destructors (kubetrain.runtime.ending)."""
        received = self.stop.received
        by = received.name if received is not None else "a signal to another rank"
        saved = f"checkpoint {self.stop_saved} written" if self.stop_saved else "no checkpoint written"
        with contextlib.suppress(SystemExit):  # StopSignal.exit raises it once every rank has met
            self.stop.exit()
        message = f"kubetrain: rank {self.rank} stopped at step {state.global_step} by {by}; {saved}"
        print(f"{message}, exiting {self.exit_code}", file=sys.stderr, flush=True)
        self.leave(self.exit_code)


def _leave(code: int) -> None:
    from kubetrain.runtime import ending

    ending.leave(code)


def _stop_signal() -> Any:
    """kubetrain's stop vote on the process group the Trainer's arguments set up."""
    from kubetrain.runtime.worker import dist
    from kubetrain.runtime.worker.stopping import StopSignal

    return StopSignal(dist.current_or_alone())


def install(module: ModuleType) -> None:
    """`transformers.trainer` was imported: every Trainer made from now on gets the adapter's callback."""
    defaults = getattr(module, "DEFAULT_CALLBACKS", None)
    base = getattr(module, "TrainerCallback", None)
    if not isinstance(defaults, list) or not isinstance(base, type):
        log.warning(
            "this transformers has no transformers.trainer.DEFAULT_CALLBACKS list or TrainerCallback: kubetrain's "
            "Trainer adapter is left out (no progress records, no zero-loss stop)"
        )
        return
    if any(isinstance(callback, type) and issubclass(callback, Adapter) for callback in defaults):
        return
    prefix = getattr(module, "PREFIX_CHECKPOINT_DIR", Adapter.prefix)
    defaults.append(type("KubetrainCallback", (Adapter, base), {"prefix": prefix, "__module__": __name__}))
