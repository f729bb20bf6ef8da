"""How a training process ends: `leave(code)`, `os._exit` once its output is flushed.

Once the outcome is known (after `dist.finish` every rank has passed the last collective and
rank 0's checkpoint and records are durable; after a failure nothing is left to save),
destructors have nothing left to do but can still hang or abort: torch before 2.8 deadlocks in
`~ProcessGroupGloo` (joining a gloo thread that waits for the GIL the destructor holds,
pytorch/pytorch#56297, fixed by #154976), and after a failure a destroy waits for collectives
in flight that no peer will finish. torchrun needs only the exit code. Used by the built-in
trainer (`python -m kubetrain.trainer`), the runner of shipped functions
(`kubetrain.runtime.guest.function`) and torchrun itself (torchrun_hooks). No torch here: a usage
error still ends fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """End the process without running destructors."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
