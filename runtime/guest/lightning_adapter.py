"""A Lightning script under torchrun gets kubetrain's progress records, its checkpoints in
`lastCheckpoint`, the zero-loss stop and the hang watchdog, the script unchanged.

kubetrain.runtime.torchrun_hooks calls `install` when Lightning's trainer module is imported
(`lightning.pytorch.trainer.trainer` or `pytorch_lightning.trainer.trainer`), in whichever process
imports it: torchrun's agent may import a script's modules before it forks the workers
(kubetrain.runtime.agent.warmstart). So `install` only patches the `Trainer` class, and what a process
is is decided when a Trainer is made: in a torchrun worker (RANK and TORCHELASTIC_RUN_ID set) its
`callbacks` (a public argument) get one more, a `KubetrainCallback`; elsewhere nothing changes.
`Trainer.save_checkpoint` (public) is wrapped to record each checkpoint's path once it is written.

The callback, on every rank of a `fit`:
* rank 0 prints kubetrain's records (kubetrain.api.records' format, one JSON line on stdout, and
  into `$KUBETRAIN_CHECKPOINT_DIR/metrics.jsonl` where the job has one): `rendezvous` once the
  process group exists (`setup`), `start` (and `resume`, from `trainer.ckpt_path`) when training
  starts, `step` at the first optimizer step and then at most every RECORD_EVERY_S (global_step,
  rank 0's loss of that batch, the first learning rate), `checkpoint` after each save, `done` at
  the end;
* each optimizer step beats the hang watchdog (kubetrain.runtime.worker.watchdog);
* SIGTERM or SIGINT on any rank stops every rank at one optimizer step (kubetrain.runtime.worker.stopping's
  vote, an all_reduce at step boundaries): Lightning saves that step through its own
  `save_checkpoint` as `last.ckpt` in the dirpath of the Trainer's ModelCheckpoint (where
  `fit(ckpt_path="last")` looks; without a ModelCheckpoint nothing is saved), then every rank meets
  and exits EXIT_STOPPED (143).

Why Lightning alone took torchrun's whole shutdown timeout to stop: its SIGTERM handler
(`_SignalConnector`, "Received SIGTERM") runs a `dist.broadcast` inside the handler, on the ranks
the signal reached, at whatever point of the step they were; that collective matches nothing on
the other ranks (or a different op), so the ranks waited in it until torchrun SIGKILLed them.
Lightning installs that handler just before its training stage starts; `on_train_start` comes
after, and the stop's handlers replace it there (Lightning's teardown restores the handlers it
found). A signal before then (set-up, the sanity check) still meets Lightning's.

A guest in the user's process: a failure of the records is logged once and training goes on.
Lightning's names used here are public (Callback and its hooks, Trainer's `callbacks`,
`save_checkpoint`, `checkpoint_callback`, `ckpt_path`, ModelCheckpoint's `dirpath`,
`CHECKPOINT_NAME_LAST`, `format_checkpoint_name`). Everything kubetrain imports beyond the standard
library is imported in a worker only, when its Trainer starts training.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import time
from types import ModuleType
from typing import Any

from kubetrain.runtime.guest import guest_records

log = logging.getLogger("kubetrain.lightning_adapter")

# rank 0's step records: often enough for the bar and hangTimeoutSeconds, rarely enough to cost
# nothing whatever `log_every_n_steps` and the step time are.
RECORD_EVERY_S = 1.0
CHECKPOINT_DIR_ENV = guest_records.CHECKPOINT_DIR_ENV
STOP_REASON = "signal"
is_worker = guest_records.is_worker


def record(event: str, out: Any = None, directory: str | None = None, **fields: Any) -> dict[str, Any]:
    """One record in kubetrain.api.records' format, written as one line to `out` (stdout) and
    appended to `<directory>/metrics.jsonl` (default: $KUBETRAIN_CHECKPOINT_DIR, where set)."""
    directory = os.environ.get(CHECKPOINT_DIR_ENV) if directory is None else directory
    return guest_records.write(event, out=out, directory=directory, **fields)


def total_steps(trainer: Any) -> int | None:
    """`max_steps` when set, else Lightning's estimate of the optimizer steps of the whole fit."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps)
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if isinstance(estimate, int | float) and math.isfinite(estimate) else None


def loss_of(outputs: Any) -> float | None:
    """The loss `training_step` returned (a tensor, or a dict with `loss`), as a float."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is None:
        return None
    try:
        return float(loss.detach().item() if hasattr(loss, "detach") else loss)
    except (TypeError, ValueError, RuntimeError):
        return None


def stop_path(trainer: Any) -> str | None:
    """Where the stop saves: `last.ckpt` (ModelCheckpoint's own name of its last checkpoint) in the
    dirpath of the Trainer's first ModelCheckpoint; None without one."""
    callback = trainer.checkpoint_callback
    if callback is None or getattr(callback, "dirpath", None) is None:
        return None
    metrics = {"epoch": trainer.current_epoch, "step": trainer.global_step}
    return str(callback.format_checkpoint_name(metrics, filename=callback.CHECKPOINT_NAME_LAST))


class Adapter:
    """The callback's behaviour; `install` makes a class of it and of the package's `Callback`."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.rank = 0
        self.stop: Any = None
        self.watchdog: Any = None
        self.total: int | None = None
        self.reason: str | None = None  # the reason of the save in progress (state_dict stores it)
        self.loaded_reason: str | None = None
        self._stepped = -1
        self._loss: Any = None  # rank 0: the last step's loss (as returned: no sync at each step)
        self._last_record = -math.inf
        self._failed = False

    # --- records (rank 0) ---------------------------------------------------------------

    def _emit(self, trainer: Any, event: str, **fields: Any) -> None:
        if self.rank != 0 or self._failed:
            return
        try:
            record(event, step=trainer.global_step, epoch=trainer.current_epoch, total_steps=self.total, **fields)
        except Exception:  # never break the user's training for a record
            self._failed = True
            log.warning("kubetrain could not write this Lightning run's records", exc_info=True)

    def _step_record(self, trainer: Any) -> None:
        self._last_record = self.clock()
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0].get("lr") if optimizers and optimizers[0].param_groups else None
        self._emit(trainer, "step", loss=loss_of(self._loss), lr=lr)

    def saved(self, trainer: Any, filepath: Any) -> None:
        """Trainer.save_checkpoint returned: the file is written (rank 0 wrote it, every rank met)."""
        reason = {"reason": self.reason} if self.reason else {}
        self._emit(trainer, "checkpoint", path=_absolute(filepath), **reason)

    # --- Lightning's Callback hooks -----------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """The process group exists (Lightning made it in its strategy's set-up): the mark an
        in-place restart counts as done at (kubetrain.runtime.guest.step_watch leaves it to us)."""
        guest_records.rendezvous()

    def state_dict(self) -> dict[str, Any]:
        # Only the stop's save says why it was made; the resume record repeats it.
        return {"reason": self.reason} if self.reason else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded_reason = state_dict.get("reason")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # After Lightning's signal connector registered its handlers: the stop's replace them.
        try:
            self._start(trainer)
        except Exception:  # the user's fit goes on, as without kubetrain
            self.stop = None
            log.warning("kubetrain's Lightning adapter is off for this fit", exc_info=True)

    def _start(self, trainer: Any) -> None:
        from kubetrain.runtime.worker import dist, stopping, watchdog

        self.rank = trainer.global_rank
        self.total = total_steps(trainer)
        self.watchdog = watchdog.HangWatchdog(trainer.local_rank)
        self.watchdog.beat()
        self.stop = stopping.StopSignal(dist.current_or_alone())
        self._stepped = trainer.global_step
        resumed = _absolute(trainer.ckpt_path) if trainer.ckpt_path is not None else None
        self._emit(trainer, "start", world_size=trainer.world_size, backend=_backend(), resumed_from=resumed)
        if resumed is not None:
            self._emit(trainer, "resume", path=resumed, reason=self.loaded_reason)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.stop is None:
            return
        self.watchdog.beat()
        if trainer.global_step == self._stepped:
            return  # inside a gradient-accumulation window: not a step boundary
        self._stepped = trainer.global_step
        if self.rank == 0:
            self._loss = outputs
            if self.clock() - self._last_record >= RECORD_EVERY_S:
                self._step_record(trainer)
        if self.stop.agreed():  # collective, on every rank at the same step
            self._stop(trainer)

    def _stop(self, trainer: Any) -> None:
        from kubetrain.runtime.worker.stopping import EXIT_STOPPED

        if self.rank == 0:
            self._step_record(trainer)
        path = stop_path(trainer)
        if path is not None:
            self.reason = STOP_REASON
            trainer.save_checkpoint(path, weights_only=False)  # collective: rank 0 writes, every rank meets
            self.reason = None
        signal = self.stop.received.name if self.stop.received is not None else "a signal on another rank"
        saved = (
            f"checkpoint of step {trainer.global_step} written to {path}"
            if path
            else "no ModelCheckpoint: nothing saved"
        )
        print(f"kubetrain: stopped by {signal}; {saved}, exiting {EXIT_STOPPED}", file=sys.stderr, flush=True)
        self.stop.exit()  # every rank meets, then SystemExit(143) through Lightning's fit

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.stop is None:
            return
        self.stop.close()  # the vote in flight, on every rank at the same point
        self.stop = None
        self.watchdog.stop()
        self._emit(trainer, "done", loss=loss_of(self._loss))


def _absolute(path: Any) -> str:
    """A local path made absolute; a URL (s3://...) as it is."""
    text = str(os.fspath(path))
    return text if "://" in text else os.path.abspath(text)


def _backend() -> str | None:
    found = guest_records.world()
    return found[1] if found is not None else None


_classes: dict[type, type] = {}


def callback_class(base: type) -> type:
    """The KubetrainCallback of one Lightning package (`base`: its Callback)."""
    if base not in _classes:
        _classes[base] = type("KubetrainCallback", (Adapter, base), {"__module__": __name__})
    return _classes[base]


def with_callback(callbacks: Any, ours: Any) -> list[Any]:
    """Trainer's `callbacks` argument (None, one callback or a list) with `ours` added."""
    if callbacks is None:
        return [ours]
    if isinstance(callbacks, list | tuple):
        return [*callbacks, ours]
    return [callbacks, ours]


def install(module: ModuleType) -> None:
    """Lightning's trainer module loaded: patch its Trainer (class level; see the module docstring)."""
    trainer_class = getattr(module, "Trainer")  # noqa: B009
    if getattr(trainer_class.__init__, "_kubetrain_hooked", False):
        return
    package = module.__name__.removesuffix(".trainer.trainer")
    kubetrain_callback = callback_class(sys.modules[f"{package}.callbacks"].Callback)
    original_init, original_save = trainer_class.__init__, trainer_class.save_checkpoint

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if is_worker():
            kwargs["callbacks"] = with_callback(kwargs.get("callbacks"), kubetrain_callback())
        original_init(self, *args, **kwargs)

    @functools.wraps(original_save)
    def save_checkpoint(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_save(self, filepath, *args, **kwargs)
        for callback in self.callbacks:
            if isinstance(callback, Adapter):
                callback.saved(self, filepath)
        return result

    __init__._kubetrain_hooked = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__
    trainer_class.save_checkpoint = save_checkpoint
