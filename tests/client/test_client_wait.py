"""`Job.wait` and its progress display, against a backend whose statuses the test dictates (the
real backends are the local and cluster tests')."""

from __future__ import annotations

import io
import sys
import types
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from kubetrain.api.models import Condition, Failure, Progress, TrainingJob, TrainingJobStatus
from kubetrain.client import Job, JobFailed, JobStopped, WaitTimeout
from kubetrain.client.progress import NoDisplay, NotebookBar, TerminalBar, line, make_display

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def status(phase: str, *, step: int | None = None, total: int | None = None, **fields: Any) -> TrainingJobStatus:
    conditions = []
    if phase in ("Succeeded", "Failed"):
        conditions.append(
            Condition(type=phase, status="True", reason=fields.pop("reason", phase), last_transition_time=NOW)
        )
    progress = (
        None
        if step is None
        else Progress(
            step=step, total_steps=total, percent=None if not total else 100 * step // total, loss=0.25, epoch=1
        )
    )
    return TrainingJobStatus(phase=phase, conditions=conditions, progress=progress, **fields)  # type: ignore[arg-type]


class Scripted:
    """A backend whose job goes through `statuses`, one per read (the last one stays)."""

    kind: Literal["local"] = "local"
    namespace = "test"
    poll_s = 0.0

    def __init__(self, *statuses: TrainingJobStatus, live: bool = True) -> None:
        self.statuses = list(statuses)
        self.reads = 0
        self.settled = False
        self.live = live

    def status(self, name: str) -> TrainingJobStatus:
        current = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return current

    def get(self, name: str) -> TrainingJob:
        raise NotImplementedError

    def settle(self, name: str) -> None:
        self.settled = True

    def ensure_live(self, name: str) -> None:
        if not self.live:
            raise JobStopped(f"trainingjob {name} ended without succeeding or failing: it was stopped")

    def create(self, job: TrainingJob, config_maps: Mapping[str, Mapping[str, str]]) -> TrainingJob:
        raise NotImplementedError

    def list(self) -> list[TrainingJob]:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def log_source(self, name: str) -> Any:
        raise NotImplementedError


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.closed = False

    def update(self, name: str, status: TrainingJobStatus) -> None:
        self.lines.append(line(name, status))

    def close(self) -> None:
        self.closed = True


def test_wait_shows_each_status_and_returns_the_final_one() -> None:
    backend = Scripted(status("Pending"), status("Running", step=5, total=10), status("Succeeded", step=10, total=10))
    shown = Recorder()
    final = Job(backend, "j").wait(display=shown)
    assert final.phase == "Succeeded" and backend.settled and shown.closed
    assert shown.lines == [
        "j Pending",
        "j Running · step 5/10 (50%) · epoch 1 · loss 0.2500",
        "j Succeeded · step 10/10 (100%) · epoch 1 · loss 0.2500",
    ]


def test_a_failed_job_raises_with_its_status_and_the_last_failure() -> None:
    failure = Failure(attempt=0, rank=1, exit_code=1, reason="Error", message="ValueError: bad learning rate")
    failed = status("Failed", reason="BackoffLimitExceeded", failures=[failure])
    with pytest.raises(JobFailed) as raised:
        Job(Scripted(status("Running"), failed), "j").wait(display=Recorder())
    assert raised.value.status == failed
    assert str(raised.value) == (
        "trainingjob j failed (BackoffLimitExceeded)\n"
        "last failure: attempt 0 on node 1 (Error, exit code 1):\nValueError: bad learning rate"
    )


def test_a_timeout_leaves_the_job_and_a_stopped_runner_is_said() -> None:
    with pytest.raises(WaitTimeout, match=r"trainingjob j is still Running after 0.05 s"):
        Job(Scripted(status("Running")), "j").wait(timeout=0.05, display=Recorder())
    with pytest.raises(JobStopped, match=r"ended without succeeding or failing"):
        Job(Scripted(status("Running"), live=False), "j").wait(display=Recorder())


def test_the_terminal_bar_draws_steps_and_the_status_line() -> None:
    out = io.StringIO()
    bar = TerminalBar(out, force_terminal=True)
    bar.update("j", status("Running", step=3, total=12, restarts=1))
    bar.close()
    text = out.getvalue()
    assert "3/12" in text and "j Running · step 3/12 (25%)" in text and "restarts 1" in text


def test_the_notebook_bar_redraws_one_display(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[Any] = []

    class Handle:
        def update(self, obj: Any) -> None:
            shown.append(obj.data)

    display = types.ModuleType("IPython.display")
    display.display = lambda obj, display_id: Handle()  # type: ignore[attr-defined]
    display.HTML = lambda data: types.SimpleNamespace(data=data)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    bar = NotebookBar()
    bar.update("j", status("Running", step=2, total=4))
    bar.update("j <b>", status("Running"))
    assert shown == [
        '<progress value="2" max="4"></progress> <code>j Running · step 2/4 (50%) · epoch 1 · loss 0.2500</code>',
        "<progress></progress> <code>j &lt;b&gt; Running</code>",
    ]


def test_a_bar_only_where_someone_looks() -> None:
    assert isinstance(make_display(False), NoDisplay)
    assert isinstance(make_display(True, io.StringIO()), NoDisplay)  # a pipe, a CI log
