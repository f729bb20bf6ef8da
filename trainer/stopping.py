"""Stop at an optimizer-step boundary on SIGTERM or SIGINT, every rank together, so the step
can be checkpointed: no step is lost to a pod deletion, eviction, drain, preemption or suspend.

Kubernetes stops a pod with SIGTERM to its first process (torchrun, which passes it on to its
workers) and SIGKILL after `terminationGracePeriodSeconds`. Only the ranks of the stopped pod
see the signal; the others learn of it from one vote per optimizer step: an all_reduce of one
integer, started asynchronously after a step and finished at the next boundary, so it rides
under that step's compute (gloo; with NCCL it runs on a gloo group of its own, so it never
syncs the GPU stream). A signal is therefore acted on one or two steps after it arrived, and
every rank stops at the same step.

    stop = StopSignal(ctx)                # installs the handlers; collective
    for step ...:
        train_step(...)
        if stop.agreed():                 # once per step, on every rank
            checkpoint this step          # (collective: rank 0 writes)
            stop.exit()                   # every rank meets, then SystemExit(EXIT_STOPPED)
    stop.close()                          # at the loop's end, on every rank

A process stopped this way exits with EXIT_STOPPED (143, 128 + SIGTERM: what a runtime reports
for a process that a SIGTERM ended) after its checkpoint is durable.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from kubetrain.trainer.dist import DistContext

EXIT_STOPPED = 128 + signal.SIGTERM
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """SIGTERM/SIGINT to a flag, and the per-step vote that turns one rank's flag into everyone's stop."""

    def __init__(self, ctx: DistContext, signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
        self.received: signal.Signals | None = None
        # Handlers only exist in the main thread. They stay to the process's end: a signal
        # during the final save must not kill it.
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                signal.signal(sig, self._handle)
        self._world = ctx.world_size if dist.is_available() and dist.is_initialized() else 1
        # Collective on every rank (new_group is): one gloo group beside an NCCL default group.
        self._group: Any = dist.new_group(backend="gloo") if self._world > 1 and ctx.backend != "gloo" else None
        self._flag: torch.Tensor | None = None
        self._work: Any = None
        self._stopped = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def agreed(self) -> bool:
        """Collective, once per optimizer step on every rank: True once any rank received a signal.

        Finishes the vote started at the previous call and starts the next one, so each vote
        overlaps one step; the answer is the same on every rank."""
        if self._stopped:
            return True
        if self._world == 1:
            self._stopped = self.received is not None
            return self._stopped
        if self._work is not None:
            self._work.wait()
            assert self._flag is not None
            if int(self._flag.item()) > 0:
                self._work = self._flag = None
                self._stopped = True
                return True
        self._flag = torch.tensor([int(self.received is not None)], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, group=self._group, async_op=True)
        return False

    def exit(self) -> NoReturn:
        """After the stop's checkpoint: every rank meets (rank 0's save is durable once all
        passed), then leaves with EXIT_STOPPED. For scripts of your own (kubetrain.trainer.lib)."""
        if self._world > 1:
            dist.barrier(group=self._group)
        raise SystemExit(EXIT_STOPPED)

    def close(self) -> None:
        """Finish a vote still in flight: every rank has one at the same point of the loop."""
        if self._work is not None:
            self._work.wait()
            self._work = self._flag = None


class Stopped(Exception):
    """Raised by the loop after the stop's checkpoint is on disk."""

    def __init__(self, step: int, signum: signal.Signals | None) -> None:
        super().__init__(f"stopped at step {step} by {signum.name if signum else 'a signal on another rank'}")
        self.step = step
