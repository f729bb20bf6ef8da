"""What a local run ended with: outcome, counters, rank 0's last metrics; `summary.json` and the exit code.

Counters, failures, progress and the last checkpoint come from the run's status (the shape of
the cluster's `.status`, see `kubetrain.local.supervisor`); only what the status does not keep
(every checkpoint written, when the first step came) is read from the records here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kubetrain.api.models import Failure, LastCheckpoint, TrainingJobStatus
from kubetrain.operator.conditions import get_condition

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SIGNAL_BASE = 128

Outcome = Literal["Succeeded", "Failed", "Interrupted"]


@dataclass
class RunResult:
    outcome: Outcome
    reason: str
    run_dir: Path
    attempts: int = 0
    restarts: int = 0
    wall_s: float = 0.0
    first_step_s: float | None = None
    final_loss: float | None = None
    final_accuracy: float | None = None
    final_step: int | None = None
    checkpoints_written: list[str] = field(default_factory=list)
    last_checkpoint: LastCheckpoint | None = None
    failures: list[Failure] = field(default_factory=list)
    # Exit codes of the last attempt's node processes, by node rank (-N: killed by signal N).
    node_exit_codes: list[int | None] = field(default_factory=list)
    signal: int | None = None
    plot: str | None = None

    @property
    def exit_code(self) -> int:
        if self.outcome == "Succeeded":
            return EXIT_OK
        if self.signal is not None:
            return EXIT_SIGNAL_BASE + self.signal
        return EXIT_FAILED

    @property
    def node_failure(self) -> Failure | None:
        """The node failure that ended a failed run (None when something else did: a deadline)."""
        if self.outcome != "Failed" or not self.failures:
            return None
        last = self.failures[-1]
        return last if last.attempt == self.attempts - 1 and last.rank is not None else None

    def observe(self, record: dict[str, Any], elapsed_s: float) -> None:
        """What the status does not keep, from one of rank 0's records."""
        if record["event"] == "step" and self.first_step_s is None:
            self.first_step_s = elapsed_s
        if record["event"] == "checkpoint" and record.get("path"):
            self.checkpoints_written.append(str(record["path"]))

    def absorb(self, status: TrainingJobStatus) -> None:
        """Counters, failures and rank 0's progress from the run's final status."""
        self.attempts, self.restarts = status.attempt + 1, status.restarts
        self.failures = list(status.failures or [])
        self.last_checkpoint = status.last_checkpoint
        if status.progress is not None:
            self.final_step = status.progress.step
            self.final_loss = status.progress.loss
            self.final_accuracy = status.progress.accuracy
        if self.outcome != "Interrupted":
            condition = get_condition(status, self.outcome)
            self.reason = condition.reason if condition is not None else self.outcome

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "exitCode": self.exit_code,
            "runDir": str(self.run_dir),
            "attempts": self.attempts,
            "restarts": self.restarts,
            "wallSeconds": round(self.wall_s, 3),
            "firstStepSeconds": None if self.first_step_s is None else round(self.first_step_s, 3),
            "finalStep": self.final_step,
            "finalLoss": self.final_loss,
            "finalAccuracy": self.final_accuracy,
            "checkpointsWritten": self.checkpoints_written,
            "lastCheckpoint": None if self.last_checkpoint is None else self.last_checkpoint.wire(),
            "failures": [failure.wire() for failure in self.failures],
            "nodeExitCodes": self.node_exit_codes,
            "plot": self.plot,
        }
