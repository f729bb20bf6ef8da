"""Rank 0's metrics lines → status.progress / status.lastCheckpoint."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.api.models import LastCheckpoint, Progress
from kubetrain.api.records import fold as parse

pytestmark = pytest.mark.unit


def line(event: str, **fields: Any) -> str:
    record = {"event": event, "time": 1_700_000_000.5, "step": 0, "epoch": 0, "total_steps": 200} | fields
    return json.dumps(record)


LOG = "\n".join(
    [
        "[rank 0] INFO starting",
        line("start", world_size=2, backend="gloo"),
        line("step", step=10, loss=2.5, lr=0.01, samples_per_s=1234.5, step_time_s=0.01),
        "not json {",
        '{"event": "unknown", "step": 99}',
        line("eval", step=50, epoch=1, accuracy=0.75, eval_loss=0.9),
        line("checkpoint", step=50, epoch=1, path="/checkpoints/step-50"),
        line("step", step=60, epoch=1, loss=1.25, samples_per_s=1500.0),
    ]
)


def test_parse_latest_values() -> None:
    progress, checkpoint = parse(LOG)
    assert progress == Progress(
        epoch=1,
        step=60,
        total_steps=200,
        percent=30,
        loss=1.25,
        accuracy=0.75,
        samples_per_second=1500.0,
        updated_at=datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
    )
    assert checkpoint == LastCheckpoint(
        path="/checkpoints/step-50", step=50, time=datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    )


def test_merge_keeps_previous_fields_and_never_goes_back_a_checkpoint() -> None:
    previous = Progress(step=5, loss=9.0, accuracy=0.5)
    newer = LastCheckpoint(path="/c/step-100", step=100)
    progress, checkpoint = parse(line("resume", step=50, path="/c/step-50"), previous, newer)
    assert progress is not None and progress.loss == 9.0 and progress.accuracy == 0.5 and progress.step == 50
    assert checkpoint == newer


def test_done_means_100_percent() -> None:
    progress, _ = parse(line("done", step=199, epoch=9))
    assert progress is not None and progress.percent == 100 and progress.step == 200


def test_the_done_records_loss_is_the_final_loss() -> None:
    progress, _ = parse("\n".join([line("step", step=190, loss=0.5), line("done", step=200, loss=0.25)]))
    assert progress is not None and progress.loss == 0.25


@pytest.mark.parametrize(
    "text",
    ["", "plain text only\n", line("step", step=-1, loss="nan"), '{"event":"step","loss":NaN}', "[1,2]"],
)
def test_garbage_yields_nothing_or_safe_values(text: str) -> None:
    progress, checkpoint = parse(text)
    assert checkpoint is None
    assert progress is None or (progress.step is None and progress.loss is None)


def test_out_of_range_values_are_dropped_not_raised() -> None:
    progress, _ = parse(line("eval", step=3, accuracy=7.0) + "\n" + line("step", step=4, samples_per_s=-5))
    assert progress is not None and progress.accuracy is None and progress.samples_per_second is None
