"""Pure: when rank 0's log is due to be read, and folding what it says into the status.

While a job runs the controller reads the tail of rank 0's log at most every progress
interval (`pods/log`, read-only: the pods need no credentials) and once more on the pass
that finishes the job, so the final step and checkpoint are recorded. The metrics records
are folded by `kubetrain.api.records.fold`, the one fold the local runner uses too.

One read cannot wait for the interval: before the controller acts on a gang failure it reads
rank 0's log and decides again (`recheck`). A trainer that crashes at teardown does so
seconds after rank 0 wrote `done` and its final checkpoint, almost always after the last
periodic read; without the fresh records the late-crash rule (`failures.completed`) could
not see that the work is saved, and the whole gang would run again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubetrain.api import records
from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator.failures import completed
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
    return rank0(pods), interval


def rank0(pods: Sequence[PodView]) -> str | None:
    """Rank 0's pod if it has a log to read: started, and not being deleted."""
    return next((p.name for p in pods if p.rank == 0 and p.phase != "Pending" and not p.terminating), None)


def recheck(previous: TrainingJobStatus | None, decided: TrainingJobStatus) -> bool:
    """Whether to read rank 0's log and decide again before acting: `decided` records a new gang
    failure (a restart or a failed job follows) while the stored status does not show the work
    complete."""
    before = previous or TrainingJobStatus()
    return (decided.failures or [])[-1:] != (before.failures or [])[-1:] and completed(before) is None


def fold(status: TrainingJobStatus, text: str) -> TrainingJobStatus:
    """`status` with the metrics records found in `text` folded into progress and lastCheckpoint."""
    progress, checkpoint = records.fold(text, status.progress, status.last_checkpoint)
    return status.model_copy(update={"progress": progress, "last_checkpoint": checkpoint})


def fold_checkpoints(status: TrainingJobStatus, text: str) -> TrainingJobStatus:
    """`status` with only the checkpoint records of `text` folded into lastCheckpoint: `text` is
    the archived log of an ended pod (operator/archive.py), whose progress is not the job's."""
    checkpoint = records.fold_checkpoints(text, status.last_checkpoint)
    return status if checkpoint == status.last_checkpoint else status.model_copy(update={"last_checkpoint": checkpoint})
