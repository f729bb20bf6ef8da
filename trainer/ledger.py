"""A per-step ledger of the sample indices each rank trained: the proof of the data contract.

With KUBETRAIN_SAMPLE_LEDGER=<dir> (a test mode; nothing else writes it) each rank of the built-in
trainer appends one JSON line per optimizer step to `<dir>/ledger-<pid>.jsonl`:
{"time", "epoch", "step", "world_size", "rank", "indices"}, after the step is done. The union over ranks
of a step's indices is its global batch; a step trained twice (after a resume from before it)
appears twice, and the later one counts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from kubetrain.api.contract import LEDGER_ENV as LEDGER_ENV


class Indexed(Dataset[Any]):
    """A dataset whose items carry their index last: (x, y, index)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return (*self.dataset[index], index)

    def __len__(self) -> int:
        return len(self.dataset)


class SampleLedger:
    def __init__(self, directory: Path, rank: int, world_size: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = rank, world_size
        self.file = (directory / f"ledger-{os.getpid()}.jsonl").open("a", encoding="utf-8")

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> SampleLedger | None:
        directory = os.environ.get(LEDGER_ENV)
        return cls(Path(directory), rank, world_size) if directory else None

    def write(self, state: Any, batches: list[Any]) -> None:
        """After a step: the indices of `batches`, the (x, y, index) micro-batches it trained."""
        indices = [int(i) for batch in batches if len(batch) > 2 for i in batch[2]]
        line = {
            "time": time.time(),
            "epoch": state.epoch,
            "step": state.step,
            "world_size": self.world_size,
            "rank": self.rank,
        }
        self.file.write(json.dumps({**line, "indices": indices}) + "\n")
        self.file.flush()


def read(directory: Path) -> list[dict[str, Any]]:
    """Every line of every rank's ledger under `directory`, oldest first."""
    lines: list[dict[str, Any]] = []
    for path in directory.glob("ledger-*.jsonl"):
        lines.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return sorted(lines, key=lambda line: float(line["time"]))
