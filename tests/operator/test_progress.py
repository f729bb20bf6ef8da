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


# --- the marks of an attempt's start-up and end (api/records.py MARKS) ------------------------


def mark(event: str, at: float, **fields: Any) -> str:
    return json.dumps({"event": event, "time": at, **fields})


T = 1_700_000_100.0


def test_marks_never_move_progress() -> None:
    before, _ = parse(line("step", step=60, loss=1.0))
    after, _ = parse(
        "\n".join(
            [mark("rendezvous", T, attempt=1), mark("launch", T, attempt=1, node=0), mark("failure", T, attempt=1)]
        ),
        before,
    )
    assert after == before


def test_the_timeline_takes_the_first_milestones_of_its_attempt() -> None:
    from kubetrain.api.models import Timeline
    from kubetrain.api.records import fold_timeline

    since = datetime.fromtimestamp(T, UTC)
    line0 = Timeline(attempt=2, start="InPlace", detected_at=since)
    text = "\n".join(
        [
            line("step", step=40, attempt=1, time=T + 0.5),  # the attempt before, printed late
            mark("launch", T + 0.2, attempt=2, node=1),  # another node's agent: not the timeline's
            mark("launch", T + 0.3, attempt=2, node=0),
            mark("rendezvous", T + 0.45, attempt=2),
            line("start", step=22, attempt=2, time=T + 0.6),
            line("step", step=23, attempt=2, time=T + 0.8),
            line("step", step=25, attempt=2, time=T + 0.9),
        ]
    )
    folded = fold_timeline(text, line0)
    assert folded is not None
    assert [
        round(t.timestamp() - T, 3) for t in (folded.workers_started_at, folded.rendezvous_at, folded.first_step_at)
    ] == [
        0.3,
        0.45,
        0.8,
    ]
    # A script's own records carry no attempt: they count from the attempt's start.
    own = fold_timeline(line("step", step=1, time=T - 1) + "\n" + line("step", step=2, time=T + 2), line0)
    assert own is not None and own.first_step_at == datetime.fromtimestamp(T + 2, UTC)


def test_the_gang_failure_of_an_attempt_is_its_newest_failure_record() -> None:
    from kubetrain.api.records import gang_failure

    text = "\n".join(
        [
            mark("failure", T, attempt=0, node=1, rank=1, exit_code=137, reason="Error", message="old"),
            mark("failure", T + 5, attempt=1, node=0, rank=3, exit_code=1, reason="OOMKilled", message="new"),
            "garbage",
        ]
    )
    found = gang_failure(text, 1)
    assert found is not None and (found.node, found.rank, found.exit_code, found.reason, found.message) == (
        0,
        3,
        1,
        "OOMKilled",
        "new",
    )
    assert gang_failure(text, 2) is None and gang_failure(mark("failure", T, attempt=1), 1) is None


def test_a_pod_that_turns_not_ready_during_its_attempt_is_read_for_a_held_failure() -> None:
    from dataclasses import replace
    from datetime import timedelta

    from support.decisions import make_job
    from support.pods import T0, pod_view

    from kubetrain.api.models import Timeline, TrainingJobStatus
    from kubetrain.api.records import GangFailure
    from kubetrain.operator.progress import held_suspect, holding

    job = make_job()
    running = [pod_view(job, r, phase="Running") for r in range(3)]  # started at T0
    status = TrainingJobStatus(attempt=0)
    assert held_suspect(status, running) is None, "never Ready since it started: still starting"
    flipped = [replace(p, ready_at=T0 + timedelta(seconds=40)) for p in running]
    assert held_suspect(status, [flipped[0], running[1], flipped[2]]) == "j-node-0"
    assert held_suspect(status, [running[0], running[1], flipped[2]]) == "j-node-2"
    # An in-place attempt decided at T0+41: its pods turned NotReady before, holding attempt 0.
    later = TrainingJobStatus(
        attempt=1, timeline=Timeline(attempt=1, start="InPlace", detected_at=T0 + timedelta(seconds=41))
    )
    moved = [replace(p, attempt=1) for p in flipped]
    assert held_suspect(later, moved) is None
    held = GangFailure(1, 2, 2, 137, "Error", "x", T0)
    attached = holding(moved, held)
    assert [p.held for p in attached] == [None, None, held]


# --- a stale attempt's commit the object store refused (checkpoint_refused) -------------------


def refused(at: float, step: int, attempt: int = 1, **fields: Any) -> str:
    path = f"s3://bucket/runs/a/step-{step}"
    return mark(
        "checkpoint_refused", at, step=step, epoch=0, path=path, refused_attempt=attempt, current_attempt=2, **fields
    )


def test_a_refused_commit_is_remembered_newest_first_and_moves_no_progress() -> None:
    from kubetrain.api.models import CheckpointRefusal
    from kubetrain.api.records import fold_refusal

    before, checkpoint = parse(line("step", step=60, loss=1.0))
    after, same = parse(refused(T, 40), before, checkpoint)
    assert (after, same) == (before, checkpoint), "a stale attempt's step is not the job's progress"
    first = fold_refusal("a log line\n" + refused(T, 40), None)
    assert first == CheckpointRefusal(
        attempt=1,
        current_attempt=2,
        step=40,
        path="s3://bucket/runs/a/step-40",
        time=datetime(2023, 11, 14, 22, 15, tzinfo=UTC),
    )
    assert fold_refusal(refused(T, 40), first) == first, "the same record read again"
    newer = fold_refusal("\n".join([refused(T, 40), refused(T + 5, 50)]), first)
    assert newer is not None and newer.step == 50
    # An older refusal found later (an archived log) does not replace the newer one.
    assert fold_refusal(refused(T, 40), newer) == newer
    # A record without the attempt or the path names nothing: ignored.
    assert fold_refusal(mark("checkpoint_refused", T, step=40, refused_attempt=1), None) is None
    assert fold_refusal(mark("checkpoint_refused", T, step=40, path="s3://b/x"), None) is None


# --- a resume that walked back past an unusable commit (checkpoint_skipped) -----------------


def test_a_skipped_commit_is_remembered_newest_first_warned_once_and_moves_no_progress() -> None:
    from kubetrain.api.models import CheckpointSkip, TrainingJobStatus
    from kubetrain.api.records import fold_skip
    from kubetrain.operator.progress import fold as fold_status
    from kubetrain.operator.progress import refusal_events

    def skipped(at: float, step: int) -> str:
        path = f"s3://bucket/runs/a/step-{step}-a1-r0-0123abcd"
        return mark("checkpoint_skipped", at, step=step, attempt=2, path=path, why="state.pt is missing")

    before, checkpoint = parse(line("step", step=60, loss=1.0))
    assert parse(skipped(T, 40), before, checkpoint) == (before, checkpoint), "a skip is no progress"
    first = fold_skip("a log line\n" + skipped(T, 40), None)
    assert first == CheckpointSkip(
        attempt=2,
        step=40,
        path="s3://bucket/runs/a/step-40-a1-r0-0123abcd",
        why="state.pt is missing",
        time=datetime(2023, 11, 14, 22, 15, tzinfo=UTC),
    )
    assert fold_skip(skipped(T, 40), first) == first, "the same record read again"
    newer = fold_skip(skipped(T + 5, 50), first)
    assert newer is not None and newer.step == 50
    assert fold_skip(skipped(T, 40), newer) == newer, "an older skip found later does not replace it"
    assert fold_skip(mark("checkpoint_skipped", T, step=40), None) is None, "a record naming no path"

    stored = TrainingJobStatus()
    folded = fold_status(stored, skipped(T, 40))
    (event,) = refusal_events(stored, folded)
    assert (event.type, event.reason) == ("Warning", "CheckpointSkipped")
    assert "step 40 (s3://bucket/runs/a/step-40-a1-r0-0123abcd)" in event.message and "missing" in event.message
    assert refusal_events(folded, fold_status(folded, skipped(T, 40))) == [], "warned once"


# --- a torchrun agent's runtime fallback (kubetrain.runtime.torch_private) ------------------


def test_runtime_fallbacks_are_kept_once_per_feature_and_move_no_progress() -> None:
    from kubetrain.api.models import RuntimeFallback
    from kubetrain.api.records import fold_fallbacks

    def fallback(at: float, feature: str, message: str = "m") -> str:
        return mark("fallback", at, feature=feature, torch="2.9.1", missing=["X._y()"], message=message)

    before, checkpoint = parse(line("step", step=60, loss=1.0))
    assert parse(fallback(T, "warm-start"), before, checkpoint) == (before, checkpoint)
    first = fold_fallbacks("a log line\n" + fallback(T, "warm-start"), None)
    time = datetime(2023, 11, 14, 22, 15, tzinfo=UTC)
    assert first == [RuntimeFallback(feature="warm-start", torch="2.9.1", message="m", time=time)]
    assert fold_fallbacks(fallback(T + 5, "warm-start", "later"), first) is first, "one per feature"
    both = fold_fallbacks(fallback(T + 5, "exit-barrier"), first)
    assert [f.feature for f in both or []] == ["warm-start", "exit-barrier"]
    assert fold_fallbacks(mark("fallback", T, torch="2.9.1"), None) is None, "a record naming no feature"
