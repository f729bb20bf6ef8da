"""KUBETRAIN_FAULT: parsing (a typo names the part) and firing once per job."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubetrain.api.models import EnvVar
from kubetrain.trainer.faults import Fault, FaultPoint, FaultSpecError, InjectedFault, parse

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("exit,rank=1,step=30", Fault("exit", 1, 30)),
        ("exit, rank=0, step=5, code=3", Fault("exit", 0, 5, code=3)),
        ("hang,rank=2,step=1,once=false", Fault("hang", 2, 1, once=False)),
        ("kill,step=7,rank=1", Fault("kill", 1, 7)),
        ("slow,rank=0,step=20,ms=250", Fault("slow", 0, 20, ms=250)),
    ],
)
def test_parse(text: str, fault: Fault) -> None:
    assert parse(text) == fault


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("crash,rank=1,step=3", "kind 'crash' is not one of exit, kill, raise, hang"),
        ("exit,rank=1", "step= is missing"),
        ("exit,step=1", "rank= is missing"),
        ("exit,rank=one,step=1", "rank='one' is not an integer"),
        ("exit,rank=1,step=-1", "step must not be negative"),
        ("exit,rank=1,step=1,after=3", "'after=3' is not rank=, step=, code=, ms= or once="),
        ("slow,rank=1,step=1", "slow needs ms="),
        ("exit,rank=1,step=1,once=maybe", "once='maybe' is not true or false"),
    ],
)
def test_a_bad_fault_names_the_part(text: str, named: str) -> None:
    with pytest.raises(FaultSpecError, match="KUBETRAIN_FAULT") as caught:
        parse(text)
    assert named in str(caught.value)


def test_only_the_named_rank_fires_once_per_job(tmp_path: Path) -> None:
    env = {"KUBETRAIN_FAULT": "raise,rank=1,step=3"}
    assert FaultPoint.from_env(0, tmp_path, env).fault is None
    point = FaultPoint.from_env(1, tmp_path, env)
    point.reached(2)
    with pytest.raises(InjectedFault, match="step 3"):
        point.reached(3)
    assert (tmp_path / ".faults" / "raise-rank1-step3").exists()
    # The next attempt (a new process) finds the marker and trains on.
    again = FaultPoint.from_env(1, tmp_path, env)
    assert again.fault is None
    again.reached(3)
    # once=false fires in every attempt.
    with pytest.raises(InjectedFault):
        FaultPoint.from_env(1, tmp_path, {"KUBETRAIN_FAULT": "raise,rank=1,step=3,once=false"}).reached(3)


def test_a_job_may_set_the_fault_variable_but_no_other_kubetrain_name() -> None:
    assert EnvVar(name="KUBETRAIN_FAULT", value="exit,rank=1,step=3").name == "KUBETRAIN_FAULT"
    with pytest.raises(ValueError, match="reserved"):
        EnvVar(name="KUBETRAIN_CONFIG", value="{}")


def test_a_slow_rank_sleeps_after_every_step_from_its_step_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []
    monkeypatch.setattr("kubetrain.trainer.faults.time.sleep", naps.append)
    point = FaultPoint.from_env(0, tmp_path, {"KUBETRAIN_FAULT": "slow,rank=0,step=3,ms=250"})
    for step in range(1, 6):
        point.reached(step)
    assert naps == [0.25, 0.25, 0.25]  # steps 3, 4 and 5


def test_a_slow_rank_resumed_past_its_step_is_slow_from_its_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []
    monkeypatch.setattr("kubetrain.trainer.faults.time.sleep", naps.append)
    point = FaultPoint.from_env(0, tmp_path, {"KUBETRAIN_FAULT": "slow,rank=0,step=3,ms=250,once=false"})
    for step in range(8, 10):
        point.reached(step)
    assert naps == [0.25, 0.25]
    # Once (the default): a later attempt finds the marker and trains at full speed.
    again = FaultPoint.from_env(0, tmp_path, {"KUBETRAIN_FAULT": "slow,rank=0,step=3,ms=250"})
    again.reached(9)
    assert naps == [0.25, 0.25]
