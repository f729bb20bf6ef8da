"""Stop at an optimizer-step boundary on SIGTERM or SIGINT, every rank together, so the step
can be checkpointed: no step is lost to a pod deletion, eviction, drain, preemption or suspend.

Kubernetes stops a pod with SIGTERM to its first process (torchrun, which passes it on to its
workers) and SIGKILL after `terminationGracePeriodSeconds`. Only the ranks of the stopped pod
see the signal; the others learn of it from a vote: an all_reduce of two integers, started
asynchronously at a step boundary and finished at a later one, so it rides under the steps
in between (gloo; with NCCL it runs on a gloo group of its own, so it never syncs the GPU
stream). A vote is not free: 0.3 ms of CPU per rank with gloo on CPU (up to ~1.5 ms beside
DDP's own traffic on a loaded machine), a quarter of a README-sized step when it came after
every step (benchmarks/stop_on_signal.py, docs/benchmarks-24.md). So the ranks vote about every
VOTE_INTERVAL_S, and after every step once steps take that long: each vote also carries
every rank's proposal of how many steps make that interval, and all ranks take the same
mean of them. A signal is therefore acted on within about two intervals, or two steps when
steps are longer, after it arrived, and every rank stops at the same step.

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
import sys
import threading
import time
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from kubetrain.runtime import ending
from kubetrain.runtime.worker.dist import DistContext

EXIT_STOPPED = 128 + signal.SIGTERM
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The ranks vote about this often (after every step once steps take longer), and at least every
# MAX_STEPS_PER_VOTE steps: a vote then costs well under 1% of the time, and a signal waits about
# two intervals, nothing against the pods' grace period (api/contract.py DEFAULT_GRACE_SECONDS).
# The cap bounds the wait when steps slow down suddenly (an eval, a slow rank, a contended node):
# the spacing follows the step time only at a vote, so at worst a signal waits 2 x 16 slow steps.
VOTE_INTERVAL_S = 0.25
MAX_STEPS_PER_VOTE = 16
# A rank that got the signal and reaches no agreed stop within this long, or three of its longest
# steps if that is more, is stuck: in a collective whose peer hangs or is gone, in a data loader,
# in the user's code. It then exits at once with EXIT_STOPPED and no checkpoint (the last one
# stands), as SIGTERM's default would have: waiting out the pod's grace period (120 s) would only
# hold the gang restart, and its exit is what lets its peers' collectives fail.
STUCK_AFTER_S = 30.0


def loader_worker_init(worker_id: int) -> None:
    """A DataLoader's `worker_init_fn`: its worker processes ignore SIGTERM and SIGINT. They share
    their rank's process group, and torchrun stops a rank by signalling that group (as a terminal
    does with Ctrl-C): a worker that died of it would fail the rank's next batch before the rank
    could reach its stop step and save it. They end with their rank (torch's workers watch it)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


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
        # Steps from one vote to the next (the same on every rank), steps since the last, and when it was.
        self._every = 1
        self._steps = 0
        self._since = time.monotonic()
        self._last_call = self._since
        self._longest_step = 0.0
        self._give_up: threading.Timer | None = None
        self._over = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            if not self._over:
                wait = max(STUCK_AFTER_S, 3 * self._longest_step)
                self._give_up = threading.Timer(wait, self._stuck, args=(wait,))
                self._give_up.daemon = True
                self._give_up.start()

    def _stuck(self, waited: float) -> None:
        name = self.received.name if self.received is not None else "a signal"
        print(
            f"kubetrain: {name}, and no step boundary reached within {waited:.0f} s: exiting {EXIT_STOPPED} "
            "without a checkpoint (the last one stands)",
            file=sys.stderr,
            flush=True,
        )
        ending.leave(EXIT_STOPPED)

    def _settled(self) -> None:
        """The stop is agreed (its save follows) or the loop ended: no giving up any more."""
        self._over = True
        if self._give_up is not None:
            self._give_up.cancel()
            self._give_up = None

    def agreed(self) -> bool:
        """Collective, once per optimizer step on every rank: True once any rank received a signal.

        Every `_every` calls, finishes the vote started the last time and starts the next one,
        so each vote overlaps the steps in between; the answer is the same on every rank."""
        if self._stopped:
            return True
        now = time.monotonic()
        self._longest_step = max(self._longest_step, now - self._last_call)
        self._last_call = now
        if self._world == 1:
            self._stopped = self.received is not None
            if self._stopped:
                self._settled()
            return self._stopped
        self._steps += 1
        if self._steps < self._every:
            return False
        now = time.monotonic()
        if self._work is not None:
            self._work.wait()
            assert self._flag is not None
            signalled, proposals = self._flag.tolist()
            if signalled > 0:
                self._work = self._flag = None
                self._stopped = True
                self._settled()
                return True
            # The same sum on every rank: every rank counts the same steps to the next vote.
            self._every = max(1, min(MAX_STEPS_PER_VOTE, proposals // self._world))
        step_s = (now - self._since) / self._steps
        proposal = MAX_STEPS_PER_VOTE if step_s <= 0 else max(1, min(MAX_STEPS_PER_VOTE, int(VOTE_INTERVAL_S / step_s)))
        self._steps, self._since = 0, now
        self._flag = torch.tensor([int(self.received is not None), proposal], dtype=torch.int64)
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
        self._settled()
        if self._work is not None:
            self._work.wait()
            self._work = self._flag = None


class Stopped(Exception):
    """Raised by the loop after the stop's checkpoint is on disk."""

    def __init__(self, step: int, signum: signal.Signals | None) -> None:
        super().__init__(f"stopped at step {step} by {signum.name if signum else 'a signal on another rank'}")
        self.step = step
