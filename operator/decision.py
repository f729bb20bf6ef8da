"""What `status.decide` returns (the Decision and its Events), the operator-wide Policy it
reads, and the StaleView it raises; the local runner and the controller both apply these."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator.podgroup import GroupApi, Mode
from kubetrain.operator.settings import DEFAULTS


@dataclass(frozen=True)
class Policy:
    """Operator-wide knobs that are not part of a job's spec."""

    stuck_timeout: timedelta = timedelta(seconds=DEFAULTS.stuck_timeout_seconds)
    # The straggler rule (status._stragglers): how long after rank 0's `done` a rank may still
    # run before its pod is deleted and the job succeeds without it. Clean exits take seconds;
    # node 0 itself waits up to 60 s in its exit barrier for the other nodes' agents.
    straggler_timeout: timedelta = timedelta(seconds=DEFAULTS.straggler_timeout_seconds)
    # The grace period of the pods deleted after a crash or a stall. A disruption (a pod
    # deleted, evicted, preempted; suspend) leaves the gang whole, and the pods' own grace
    # lets every rank checkpoint its current step; after a crash the survivors cannot (their
    # next collective with the failed rank errors), so a long grace would only delay the restart.
    failed_gang_grace_seconds: int = 3
    # An attempt restarted in place whose rank 0 has not joined its process group this long
    # after the decision is recreated instead (failure reason InPlaceRestartTimedOut).
    in_place_timeout: timedelta = timedelta(seconds=60)
    # The PodGroup API versions the cluster serves (operator/podgroup.py; the operator's
    # discovery); None where no scheduler places the pods (the local runner).
    group_apis: frozenset[str] | None = None


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Hold:
    """Keep the job suspended although runPolicy.suspend is false: a queue (Kueue) has not
    admitted it, or took its admission back. `reason`/`message` go to the Suspended condition;
    `disruption`: a running attempt it stops counts in uncountedRestarts (a preemption)."""

    reason: str
    message: str
    disruption: bool = False


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: TrainingJobStatus
    create_service: bool = False
    create_ranks: list[int] = field(default_factory=list)
    # (name, uid): deleted with a uid precondition so that a same-named pod of a newer
    # attempt is never hit.
    delete_pods: list[tuple[str, str]] = field(default_factory=list)
    # The grace period of those deletes; None: the pods' own (terminationGracePeriodSeconds).
    delete_grace_seconds: int | None = None
    # (name, uid): living pods to move to the status's attempt (relabelled): their torchrun
    # agents restart their workers as that attempt, in place (runtime/agent/inplace.py).
    restart_in_place: list[tuple[str, str]] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # The status must be written before anything is deleted: it records why (the failure,
    # the new attempt), and a crash after the deletes must not lose that.
    commit_first: bool = False
    # The attempt's gang mode (its GangScheduling condition) and the PodGroup API its pods join,
    # from Policy.group_apis (None: mode "none"): the controller creates and joins the PodGroup with them.
    gang_mode: Mode = "none"
    group_api: GroupApi | None = None

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


class StaleView(Exception):
    """Pods of a newer attempt than the status knows: the job body is out of date."""
