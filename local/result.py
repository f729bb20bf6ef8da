"""What a local run ended with: outcome, counters, rank 0's last metrics; `summary.json` and the exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    failures: list[dict[str, Any]] = field(default_factory=list)
    # Exit codes of the last attempt's node processes, by node rank.
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
            "failures": self.failures,
            "nodeExitCodes": self.node_exit_codes,
            "plot": self.plot,
        }
