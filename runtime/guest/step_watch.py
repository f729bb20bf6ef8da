"""Progress and hang evidence for any training script under torchrun, the script unchanged: both
come from its optimizer steps, the one thing every training loop does.

Loaded by kubetrain.runtime.torchrun_hooks; it acts in torchrun's workers (RANK and
TORCHELASTIC_RUN_ID set). When `torch.optim.optimizer` is imported it registers a global optimizer-step post hook
(`register_optimizer_step_post_hook`, public torch API); when the script's
`init_process_group` returns it arms the hang watchdog (kubetrain.runtime.worker.watchdog). Then:

* every rank's watchdog is beaten at each optimizer step, so a rank that stops stepping dumps its
  stacks and a Stalled gang's culprit rank and `file:line` can be named (operator/forensics.py);
* rank 0 prints a `rendezvous` record once the script's process group exists (an in-place
  restart counts as done at it) and a `step` record (kubetrain.api.records) at its first step, then every
  RECORD_EVERY_S and at exit, so status.progress moves, hangTimeoutSeconds can declare a stall
  and a run's summary shows its final step.

The step a record carries is the optimizer's own count where it keeps one (Adam, AdamW and most
adaptive optimizers store `step` per parameter, restored by `load_state_dict`, so a resumed script
reports the step it resumed at); otherwise the steps this process has taken.

A script that reports its own progress — the built-in trainer, scripts using
`kubetrain.trainer.lib` — is left alone: it has its own watchdog and records, and two sources
would make the step jump. It is recognized by those modules being imported. Everything here is a
guest in the user's process: a failure is logged once and the script goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from typing import Any

from kubetrain.runtime.guest import guest_records

log = logging.getLogger("kubetrain.step_watch")

# How often rank 0 reports progress: often enough for the shortest hang timeout the API allows,
# rarely enough to cost nothing and to keep logs readable.
RECORD_EVERY_S = 5.0
# Modules whose presence means the script reports its own progress and beats its own watchdog.
SELF_REPORTING = (
    "kubetrain.trainer.train",
    "kubetrain.trainer.lib",
    "kubetrain.runtime.guest.hf_adapter",
    "kubetrain.runtime.guest.lightning_adapter",
)


def self_reporting() -> bool:
    return any(name in sys.modules for name in SELF_REPORTING)


def optimizer_step(optimizer: Any) -> int | None:
    """The step count an optimizer keeps in its state (a tensor or a number), if it keeps one."""
    try:
        first = optimizer.param_groups[0]["params"][0]
        step = optimizer.state.get(first, {}).get("step")
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    if step is None:
        return None
    try:
        return int(float(step))
    except (TypeError, ValueError, RuntimeError):
        return None


class StepWatch:
    """One worker's view of its optimizer steps: beats its watchdog, and on rank 0 reports progress."""

    def __init__(self, rank: int, local_rank: int, clock: Any = time.monotonic, out: Any = None) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.clock = clock
        self.out = out
        self.steps = 0
        self.step = 0
        self._recorded: int | None = None
        self.watchdog: Any = None
        self._last_record = -1e18
        self._failed = False

    def arm(self) -> None:
        """The process group exists: from now on a rank that stops stepping leaves its stacks."""
        if self.watchdog is None and not self_reporting():
            from kubetrain.runtime.worker.watchdog import HangWatchdog

            self.watchdog = HangWatchdog(self.local_rank)
            self.watchdog.beat()

    def stepped(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        """The optimizer-step post hook (torch calls it with the optimizer, args, kwargs)."""
        if self._failed:
            return
        try:
            self._stepped(optimizer)
        except Exception:  # never break the user's training step
            self._failed = True
            log.warning("kubetrain could not follow this script's optimizer steps", exc_info=True)

    def _stepped(self, optimizer: Any) -> None:
        if self_reporting():
            # Imported after the process group was made (a function that calls lib.context()):
            # its timer goes, or it would dump stacks that no beat of ours puts off any more.
            if self.watchdog is not None:
                self.watchdog.stop()
                self.watchdog = None
            return
        self.steps += 1
        if self.watchdog is not None:
            self.watchdog.beat()
        if self.rank != 0:
            return
        step = optimizer_step(optimizer)
        self.step = step if step is not None and step >= self.steps else self.steps
        if self._recorded is None:
            atexit.register(self.flush)
        now = self.clock()
        if now - self._last_record >= RECORD_EVERY_S:
            self._last_record = now
            self.record(self.step)

    def flush(self) -> None:
        """At exit: the last step taken, if no record said it yet (the summary's final step)."""
        if self._recorded is not None and self.step > self._recorded and not self_reporting():
            self.record(self.step)

    def record(self, step: int) -> None:
        self._recorded = step
        guest_records.write("step", out=self.out, step=step, source="optimizer")


_watch: StepWatch | None = None


def current() -> StepWatch | None:
    """This worker's StepWatch (created on first use); None outside a torchrun worker."""
    global _watch
    if _watch is None and guest_records.is_worker():
        _watch = StepWatch(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0") or 0))
    return _watch


def on_optimizer_module(module: Any) -> None:
    """torch.optim.optimizer loaded: follow every optimizer's steps. Registered in any process,
    the worker looked up at each step: torchrun's agent imports torch before it forks workers
    that inherit the hook (kubetrain.runtime.agent.warmstart)."""
    module.register_optimizer_step_post_hook(_stepped)


def _stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    watch = current()
    if watch is not None:
        watch.stepped(optimizer)


def on_process_group(scripted: bool = True) -> None:
    """init_process_group returned; `scripted`: the script called it (not kubetrain.runtime.worker.dist,
    which records the rendezvous itself)."""
    try:
        watch = current()
        if watch is not None:
            watch.arm()
            if scripted and not self_reporting():
                guest_records.rendezvous()
    except Exception:  # the user's process group exists; never fail its creation
        log.warning("kubetrain could not arm the hang watchdog", exc_info=True)
