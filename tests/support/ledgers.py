"""The per-step sample ledger (kubetrain.trainer.ledger) read back as steps."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from kubetrain.trainer.ledger import read


def ledger_steps(ledger: Path, *, once: bool = False) -> dict[int, tuple[int, frozenset[int], int]]:
    """step -> (epoch, the step's global sample set, its world size), the last time it was trained
    (a resume from before a step trains it again); `once`: a step trained twice fails (a step lost)."""
    by_step: dict[int, dict[int, Any]] = defaultdict(dict)
    for line in read(ledger):  # oldest first
        assert not once or line["rank"] not in by_step[line["step"]], f"step {line['step']} trained twice"
        by_step[line["step"]][line["rank"]] = line
    steps = {}
    for step, ranks in by_step.items():
        world = next(iter(ranks.values()))["world_size"]
        assert sorted(ranks) == list(range(world)), f"step {step}: ranks {sorted(ranks)} of {world}"
        samples = [i for line in ranks.values() for i in line["indices"]]
        assert len(samples) == len(set(samples)), f"step {step} trained a sample twice"
        steps[step] = (next(iter(ranks.values()))["epoch"], frozenset(samples), world)
    return steps
