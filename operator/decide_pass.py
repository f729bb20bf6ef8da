"""One pass of `status.decide`: what it observed and the Decision it builds, shared by its stages
(operator/status.py) and the elastic ones (operator/elastic.py), which import it and not each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from kubetrain.api import naming
from kubetrain.api.models import Failure, ReplicaCounts, RunPolicy, TrainingJob, TrainingJobStatus
from kubetrain.operator.conditions import set_condition
from kubetrain.operator.decision import Decision, Policy
from kubetrain.operator.forensics import RankStacks
from kubetrain.operator.pods import PodCondition, PodView

# A gang failure and the conditions of the pod it happened to (what onPodConditions matches).
Problem = tuple[Failure, tuple[PodCondition, ...]]


@dataclass
class Pass:
    """One reconcile pass: what decide observed, and the Decision (with the new status) it builds."""

    job: TrainingJob
    uid: str
    now: datetime  # whole seconds, as the API server keeps every time of a status
    precise: datetime  # to the millisecond: for the timeline, whose phases are often shorter
    policy: Policy
    previous: TrainingJobStatus
    decision: Decision
    ours: list[PodView]  # pods of this job (or unlabelled), terminating ones included
    occupied: set[str]  # names taken by any pod, ours or not
    live: list[PodView]  # ours, not terminating
    current: list[PodView]  # live pods of the current attempt (its gang's, once elastic.split_members ran)
    stale: list[PodView]  # live pods of older attempts
    stacks: Mapping[int, RankStacks] | None = None
    members: list[int] = field(default_factory=list)  # the node ranks of the attempt's gang (elastic.members)
    standby: list[PodView] = field(default_factory=list)  # live pods of the attempt outside its gang
    admitted: int | None = None  # the nodes Kueue admitted an elastic job with (partial admission)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def status(self) -> TrainingJobStatus:
        return self.decision.status

    @property
    def run(self) -> RunPolicy:
        return self.job.spec.run_policy

    def condition(self, kind: str, value: bool, reason: str, message: str, *, only_if_present: bool = False) -> bool:
        generation = self.job.metadata.generation
        return set_condition(
            self.status, kind, value, reason, message, self.now, generation, only_if_present=only_if_present
        )

    def vanished(self, deleted: list[PodView]) -> list[PodView]:
        """Ranks missing after every pod of this attempt was observed once: deleted (and already
        gone), not "not created yet"."""
        attempt = self.status.attempt
        if self.previous.attempt != attempt or not self.members or _seen(self.previous.replicas) < self.size:
            return []
        present = {p.rank for p in self.current} | {p.rank for p in deleted}
        return [
            PodView(naming.pod_name(self.job.name, r), "", self.uid, r, attempt, "Unknown", True, None)
            for r in self.members
            if r not in present
        ]


def _seen(counts: ReplicaCounts | None) -> int:
    return 0 if counts is None else counts.active + counts.succeeded + counts.failed
