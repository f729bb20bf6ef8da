"""Pure: when rank 0's log is due to be read, and folding what it says into the status.

While a job runs the controller reads the tail of rank 0's log at most every progress
interval (`pods/log`, read-only: the pods need no credentials) and once more on the pass
that finishes the job, so the final step and checkpoint are recorded. The metrics records
are folded by `kubetrain.api.records.fold`, the one fold the local runner uses too.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubetrain.api import records
from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator.status import PodView

READ_IN = ("Running", "Restarting")


def due(
    previous: TrainingJobStatus | None,
    status: TrainingJobStatus,
    pods: Sequence[PodView],
    since_read: float | None,
    interval: float,
) -> tuple[str | None, float | None]:
    """Rank 0's pod if its log is due now (else None), and when to look again (None: not while
    the job is in this state). `previous` is the status before this pass, `status` the one
    decided; `since_read` the seconds since the last read of this job (None: never)."""
    finishing = status.completion_time is not None and (previous is None or previous.completion_time is None)
    if status.phase not in READ_IN and not finishing:
        return None, None
    if not finishing and since_read is not None and since_read < interval:
        return None, interval - since_read
    rank0 = next((p for p in pods if p.rank == 0 and p.phase != "Pending" and not p.terminating), None)
    return (rank0.name if rank0 is not None else None), interval


def fold(status: TrainingJobStatus, text: str) -> TrainingJobStatus:
    """`status` with the metrics records found in `text` folded into progress and lastCheckpoint."""
    progress, checkpoint = records.fold(text, status.progress, status.last_checkpoint)
    return status.model_copy(update={"progress": progress, "last_checkpoint": checkpoint})
