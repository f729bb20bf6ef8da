"""The loss/accuracy PNG: one value per step, a resumed attempt's values win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.local_runs import run_cli

from kubetrain.local.plot import curves

pytestmark = pytest.mark.unit


def rec(event: str, step: int, **fields: float | str) -> dict[str, object]:
    return {"event": event, "time": 0.0, "step": step, "epoch": 0, "total_steps": 4, **fields}


# Attempt 0 reaches step 3, is killed, attempt 1 resumes from step 2 and trains 3 again.
RECORDS = [
    rec("start", 0),
    rec("step", 1, loss=2.0),
    rec("step", 2, loss=1.5),
    rec("eval", 2, accuracy=0.5, eval_loss=1.4),
    rec("checkpoint", 2, path="/x/step-2"),
    rec("step", 3, loss=9.0),
    rec("start", 2),
    rec("resume", 2, path="/x/step-2"),
    rec("step", 3, loss=1.0),
    rec("step", 4, loss=0.5),
    rec("eval", 4, accuracy=0.9, eval_loss=0.4),
]


def test_curves_keep_the_latest_value_per_step() -> None:
    data = curves(RECORDS)
    assert (data.steps, data.loss) == ([1, 2, 3, 4], [2.0, 1.5, 1.0, 0.5])
    assert (data.eval_steps, data.accuracy, data.eval_loss) == ([2, 4], [0.5, 0.9], [1.4, 0.4])
    assert data.restarts_at == [2]


def test_plot_command_writes_a_png(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    lines = [json.dumps(r) for r in RECORDS] + ['{"event": "step", "ti']  # a line cut by a kill
    (tmp_path / "checkpoints" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    done = run_cli("plot", str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    png = tmp_path / "metrics.png"
    assert done.stdout.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_metrics_fails_clearly(tmp_path: Path) -> None:
    done = run_cli("plot", str(tmp_path))
    assert done.returncode == 1 and "no metrics.jsonl" in done.stderr
