"""kubetrain.runtime.guest.step_watch: progress records and watchdog beats from a script's optimizer
steps (the end-to-end case, a plain script whose rank 1 hangs, is tests/local/test_hang_forensics.py)."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest
import torch

from kubetrain.api.records import fold
from kubetrain.runtime.guest import guest_records, step_watch
from kubetrain.runtime.guest.step_watch import RECORD_EVERY_S, StepWatch

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Beats:
    def __init__(self) -> None:
        self.beats = 0
        self.stopped = False

    def beat(self) -> None:
        self.beats += 1

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture(autouse=True)
def not_self_reporting(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test process has imported kubetrain.trainer.lib elsewhere: that is what a script of
    # kubetrain's own looks like, not what these tests are about.
    monkeypatch.setattr(step_watch, "SELF_REPORTING", ("not.a.module",))


def sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_rank_0_records_its_first_step_then_at_most_every_interval_and_the_last_at_exit() -> None:
    clock, out = Clock(), io.StringIO()
    watch = StepWatch(0, 0, clock=clock, out=out)
    optimizer = sgd()
    for _ in range(10):  # within one interval: only the first step is recorded
        watch.stepped(optimizer)
        clock.now += RECORD_EVERY_S / 20
    assert [r["step"] for r in records(out)] == [1]
    clock.now += RECORD_EVERY_S
    watch.stepped(optimizer)
    watch.stepped(optimizer)
    watch.flush()
    watch.flush()  # nothing new to say
    assert [r["step"] for r in records(out)] == [1, 11, 12]
    assert all(r["event"] == "step" and r["source"] == "optimizer" for r in records(out))
    # The records fold into status.progress as the built-in trainer's do.
    progress, _ = fold(out.getvalue())
    assert progress is not None and progress.step == 12 and progress.updated_at is not None


def test_a_resumed_optimizer_reports_the_step_its_state_holds() -> None:
    model = torch.nn.Linear(2, 1)
    trained = torch.optim.AdamW(model.parameters())
    for _ in range(7):
        model(torch.ones(1, 2)).sum().backward()
        trained.step()
    resumed = torch.optim.AdamW(model.parameters())
    resumed.load_state_dict(trained.state_dict())
    assert step_watch.optimizer_step(resumed) == 7
    model(torch.ones(1, 2)).sum().backward()
    resumed.step()
    out = io.StringIO()
    StepWatch(0, 0, clock=Clock(), out=out).stepped(resumed)
    assert [r["step"] for r in records(out)] == [8]
    assert step_watch.optimizer_step(sgd()) is None  # SGD keeps no step: the process's own count


def test_other_ranks_only_beat_their_watchdog() -> None:
    out = io.StringIO()
    watch = StepWatch(1, 1, clock=Clock(), out=out)
    watch.watchdog = beats = Beats()
    optimizer = sgd()
    for _ in range(3):
        watch.stepped(optimizer)
    watch.flush()
    assert (beats.beats, out.getvalue()) == (3, "")


def test_a_self_reporting_script_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    watch = StepWatch(0, 0, clock=Clock(), out=out)
    watch.watchdog = beats = Beats()
    monkeypatch.setattr(step_watch, "SELF_REPORTING", ("json",))  # any imported module
    assert "json" in sys.modules
    watch.stepped(sgd())
    watch.flush()
    assert (out.getvalue(), beats.beats, beats.stopped, watch.watchdog) == ("", 0, True, None)


def test_a_broken_hook_is_silenced_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    watch = StepWatch(0, 0, clock=Clock(), out=io.StringIO())
    watch.stepped(object())  # not an optimizer: the step is counted, the state lookup fails quietly
    assert not watch._failed

    class Broken:
        def write(self, text: str) -> None:
            raise OSError("stdout closed")

    watch.out = Broken()
    watch._last_record = -1e18
    watch.stepped(sgd())
    watch.stepped(sgd())
    assert watch._failed and "could not follow" in caplog.text


@pytest.mark.parametrize(
    ("env", "worker"),
    [
        ({"RANK": "0", "TORCHELASTIC_RUN_ID": "j"}, True),
        ({"RANK": "3"}, False),  # a pod's env without torchrun's worker mark
        ({"TORCHELASTIC_RUN_ID": "j"}, False),  # torchrun's agent
    ],
)
def test_only_torchrun_workers_are_followed(env: dict[str, str], worker: bool) -> None:
    assert guest_records.is_worker(env) is worker
