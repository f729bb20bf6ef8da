"""Every rank's Python stacks, written to its log when its training stops stepping: the evidence
a Stalled gang restart names its culprit from (operator/forensics.py).

The operator renders KUBETRAIN_STACKS_AFTER_SECONDS (half of runPolicy.hangTimeoutSeconds) when
a job has a hang timeout. A rank that has not passed a step boundary for that long dumps the
stacks of all its threads to stderr with `faulthandler`, whose timer is a C thread: it fires
even when the Python main thread is stuck holding the GIL. A hung rank and the ranks waiting
for it in a collective all dump, so the operator, which declares the stall after the full
timeout, finds every rank's stacks in the pod logs it already reads.

faulthandler's dump names no rank, only the timeout: local rank i waits `seconds + i`, so the
dump's first line ("Timeout (0:00:12)!") says which process of the pod wrote it, and the dumps
of one pod's processes never interleave. Re-arming creates a thread, so a beat re-arms at most
every quarter of the timeout: the dump comes between 3/4 and 1 of it after the last step.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from collections.abc import Mapping

from kubetrain.api.contract import STACKS_AFTER_ENV


class HangWatchdog:
    """`beat()` once per optimizer step; inert unless KUBETRAIN_STACKS_AFTER_SECONDS is set."""

    def __init__(self, local_rank: int = 0, environ: Mapping[str, str] | None = None) -> None:
        raw = (os.environ if environ is None else environ).get(STACKS_AFTER_ENV, "")
        self.seconds = int(raw) + local_rank if raw.isdigit() and int(raw) > 0 else None
        self._armed_at = -1e18

    def beat(self) -> None:
        if self.seconds is None:
            return
        now = time.monotonic()
        if now - self._armed_at < self.seconds / 4:
            return
        self._armed_at = now
        faulthandler.dump_traceback_later(self.seconds, repeat=True, file=sys.stderr)

    def stop(self) -> None:
        if self.seconds is not None:
            faulthandler.cancel_dump_traceback_later()
