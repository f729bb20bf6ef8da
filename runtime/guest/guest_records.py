"""Records written from inside a user's process (kubetrain.runtime.guest.step_watch and the framework
adapters), by the runtime's one writer (kubetrain.runtime.records): a record on stdout and, where a
checkpoint directory is known, in its metrics.jsonl; and the rank-0 `rendezvous` mark, once. Standard
library only: kubetrain.api.records imports pydantic, which a script's own environment need not have,
and which should not load into its process before its training does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from kubetrain.api.contract import ATTEMPT_ENV as ATTEMPT_ENV
from kubetrain.api.contract import CHECKPOINT_DIR_ENV as CHECKPOINT_DIR_ENV
from kubetrain.api.record_format import METRICS_FILE as METRICS_FILE
from kubetrain.runtime import records


def is_worker(environ: Mapping[str, str] | None = None) -> bool:
    """A process torchrun started for a rank (its agent sets both for every worker)."""
    env = os.environ if environ is None else environ
    return bool(env.get("RANK", "").isdigit() and env.get("TORCHELASTIC_RUN_ID"))


def write(
    event: str, *, out: TextIO | None = None, directory: str | Path | None = None, **fields: Any
) -> dict[str, Any]:
    """One record as one line on `out` (stdout), appended to `<directory>/metrics.jsonl` too where
    a directory is given (the file `kubetrain run --local`'s summary and plot read)."""
    return records.write(event, fields, stream=out or sys.stdout, directory=directory)


def world() -> tuple[int, str] | None:
    """(world size, backend) of the default process group; None where there is none (torch.distributed
    is not even imported, or no group was made)."""
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is None or not torch_dist.is_available() or not torch_dist.is_initialized():
        return None
    return int(torch_dist.get_world_size()), str(torch_dist.get_backend())


_rendezvous_marked = False


def rendezvous() -> bool:
    """Rank 0 of a torchrun worker marks its process group's existence once per process: the
    `rendezvous` record an attempt's timeline and an in-place restart go by (on stdout only, as
    kubetrain.runtime.worker.dist marks it: metrics.jsonl holds the training's records). Whichever of
    step_watch and the adapters sees the group first writes it. True when written now."""
    global _rendezvous_marked
    found = world()
    if _rendezvous_marked or found is None or not is_worker() or os.environ.get("RANK") != "0":
        return False
    _rendezvous_marked = True
    write("rendezvous", world_size=found[0], backend=found[1])
    return True
