"""The runner of shipped functions (`python -m kubetrain.runtime.guest.function DIR`), fed by
kubetrain.client.ship as train() feeds it, run here as a world of one (without torchrun the env
contract is a single process on loopback). The 2-node runs are the client's tests."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.shipped import STEPS, adopts_its_own_group, kubeflow_ddp, raises, reports

from kubetrain.api.contract import free_port
from kubetrain.api.function import CALL_FILE, RUNNER_MODULE, SOURCE_FILE, FunctionCall
from kubetrain.api.function_call import read_call
from kubetrain.api.records import metrics_in
from kubetrain.api.training import TrainConfig
from kubetrain.client.ship import ship
from kubetrain.client.spec import function_files
from kubetrain.runtime.guest.function import job_set_up

pytestmark = pytest.mark.unit


def run(directory: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", RUNNER_MODULE, str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=None if env is None else {**os.environ, **env},
    )


def world_of_one() -> dict[str, str]:
    """What `dist.init_process_group()` reads (env://), as torchrun would set it for one process."""
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def shipped(tmp_path: Path, fn: Any, *args: Any) -> Path:
    for name, text in function_files(ship(fn, args)).items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_function_runs_inside_a_process_group_and_logs_records(tmp_path: Path) -> None:
    done = run(shipped(tmp_path, reports, "hello"))
    assert done.returncode == 0, done.stderr
    assert "hello: rank 0 of 1 on gloo, sum 1.0" in done.stdout
    assert [(r["event"], r["step"]) for r in metrics_in(done.stdout)] == [("step", s) for s in range(1, STEPS + 1)]


def test_a_function_written_for_kubeflow_initialises_and_destroys_its_own_group(tmp_path: Path) -> None:
    done = run(shipped(tmp_path, kubeflow_ddp, 1), world_of_one())
    assert done.returncode == 0, done.stderr
    assert "Distributed Training with WORLD_SIZE: 1, RANK: 0, LOCAL_RANK: 0." in done.stdout
    assert done.stdout.strip().endswith("Training is finished"), done.stdout


def test_the_context_of_a_group_the_function_initialised_is_adopted(tmp_path: Path) -> None:
    done = run(shipped(tmp_path, adopts_its_own_group), world_of_one())
    assert done.returncode == 0, done.stderr
    assert "adopted: rank 0 of 1 on gloo, sum 1" in done.stdout


def test_a_raising_function_exits_1_with_its_traceback_last(tmp_path: Path) -> None:
    done = run(shipped(tmp_path, raises, "bad hyperparameter"))
    assert done.returncode == 1
    assert "[rank 0] raises() raised:" in done.stderr
    assert done.stderr.strip().endswith("ValueError: bad hyperparameter"), done.stderr[-2000:]


@pytest.mark.parametrize(
    ("source", "call", "code", "says"),
    [
        (None, None, 2, f"{CALL_FILE}: No such file or directory"),
        ("def f():\n    pass\n", '{"function": "g"}', 2, f"{SOURCE_FILE} defines no function 'g'"),
        ("def f():\n    pass\n", '{"function": "f", "extra": 1}', 2, f"{CALL_FILE}: not a function call"),
        ("import not_installed_here\n", '{"function": "f"}', 1, "ModuleNotFoundError: No module named"),
    ],
)
def test_a_bad_shipment_is_named(tmp_path: Path, source: str | None, call: str | None, code: int, says: str) -> None:
    if source is not None:
        (tmp_path / SOURCE_FILE).write_text(source)
    if call is not None:
        (tmp_path / CALL_FILE).write_text(call)
    done = run(tmp_path)
    assert done.returncode == code, done.stderr
    assert says in done.stderr


def test_the_context_outside_a_process_group_says_where_to_call_it() -> None:
    from kubetrain.trainer import lib

    with pytest.raises(lib.ContractError, match=r"call this inside `lib.distributed\(\)`"):
        lib.context()


@pytest.mark.parametrize(
    "call",
    [
        {"function": "f"},
        {"function": "f", "args": [1, "a", None, [2]], "kwargs": {"lr": 0.1, "nested": {"k": [1]}}},
        {"function": "1f"},
        {"function": "f", "extra": 1},
        {"function": "f", "args": {"a": 1}},
        {"function": "f", "kwargs": [1]},
        {"function": "x" * 257},
        {"args": []},
    ],
)
def test_the_runners_reader_takes_exactly_what_the_clients_model_does(call: dict[str, Any]) -> None:
    """The runner reads call.json without pydantic (it runs in images without it); FunctionCall,
    which writes it, is the reference."""
    text = json.dumps(call)
    try:
        expected: Any = FunctionCall.model_validate_json(text).model_dump()
    except ValidationError:
        expected = None
    try:
        found: Any = dataclasses.asdict(read_call(text))
    except ValueError:
        found = None
    assert found == expected


def test_the_runners_set_up_defaults_are_the_trainers() -> None:
    """What job_set_up leaves out keeps set_up_on_first_use's defaults: TrainConfig's."""
    from kubetrain.runtime.worker import dist

    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(dist.set_up_on_first_use).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    config = TrainConfig()
    assert defaults == {
        "backend": config.backend,
        "timeout_s": config.training.process_group_timeout_seconds,
        "connect_timeout_s": config.training.connect_timeout_seconds,
    }
    assert job_set_up("") == {}
    given = TrainConfig.model_validate({"backend": "gloo", "training": {"processGroupTimeoutSeconds": 60}})
    assert job_set_up(given.to_env_value()) == {"backend": "gloo", "timeout_s": 60, "connect_timeout_s": 300}
