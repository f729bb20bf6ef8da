"""The client's local backend: the same jobs as `kubetrain run --local`, run by a thread of the
test process with the command's own machinery (no `kubetrain` subprocess). Real 2-node gloo runs
of a shipped function and of the built-in trainer; fake node scripts (no torch) for the rest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.jobs import fake_job, valid_job, write_job
from support.local_runs import finish_run
from support.shipped import STEPS, all_reduce_ranks, fails, fails_differently, kubeflow_ddp
from support.waiting import wait_for

from kubetrain.api.models import TrainingJob
from kubetrain.api.records import MARKS, parse_record
from kubetrain.client import (
    AlreadyExists,
    Client,
    InvalidJob,
    Job,
    JobFailed,
    JobNotFound,
    LogsUnavailable,
    ShipError,
    WaitTimeout,
)
from kubetrain.trainer import lib

pytestmark = pytest.mark.train

TIMEOUT = 240  # 2 cores shared with other test runs: torch imports alone can take 10 s


def sleeps(seconds: float) -> None:
    print(f"rank {lib.context().rank} sleeping", flush=True)
    time.sleep(seconds)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    client = Client("local", run_dir=tmp_path / "runs")
    yield client
    for job in client.list_jobs():  # whatever a failed test left running
        job.delete()


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kubetrain_cli_children() -> list[list[str]]:
    """Descendants of this process running the `kubetrain` command."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if any(Path(arg).name == "kubetrain" for arg in argv[:2]):
            found.append(argv)
    return found


def test_a_function_on_two_nodes_succeeds_with_both_ranks_logs_and_rank0_metrics(client: Client) -> None:
    job = client.train(all_reduce_ranks, nodes=2, args=(1,), spec={"runPolicy": {"maxRestarts": 0}})
    assert kubetrain_cli_children() == []  # the supervisor is a thread here; only torchrun runs
    status = job.wait(timeout=TIMEOUT)
    assert status.phase == "Succeeded"
    assert status.progress is not None and (status.progress.step, status.progress.total_steps) == (STEPS, STEPS)

    lines = job.logs()
    # Ranks 0 and 1 contribute 1 and 2: each prints its own part and the same sum.
    assert "[node-0] rank 0 of 2: 1 -> sum 3" in lines and "[node-1] rank 1 of 2: 2 -> sum 3" in lines
    assert [line.split(" ")[0] for line in lines] == sorted(line.split(" ")[0] for line in lines)  # node by node
    assert job.logs(rank=1) == [line for line in lines if line.startswith("[node-1] ")]
    # A finished job: the same lines, each with its attempt (as `kubetrain logs -f`), then the end;
    # each node's in order, the nodes' read at once (interleaved as they come).
    followed = list(job.logs(follow=True))
    for rank in (0, 1):
        node, followed_node = f"[node-{rank}] ", f"[attempt 0 node-{rank}] "
        mine = [line.removeprefix(node) for line in lines if line.startswith(node)]
        assert [line.removeprefix(followed_node) for line in followed if line.startswith(followed_node)] == mine
    assert len(followed) == len(lines)

    metrics = job.metrics()
    assert [(m["event"], m["step"], m["loss"]) for m in metrics] == [("step", s, 1.0 / s) for s in (1, 2, 3)]
    assert [j.name for j in client.list_jobs()] == [job.name]
    output = (Path(client.namespace) / job.name / "output.log").read_text()
    assert "[node-1] rank 1 of 2: 2 -> sum 3" in output and "Succeeded (AllNodesSucceeded)" in output


def test_a_trainingjob_model_runs_the_built_in_trainer_to_succeeded(client: Client) -> None:
    training = {"model": "mlp", "dataset": "synthetic", "syntheticSamples": 256, "epochs": 1, "batchSize": 32}
    model = TrainingJob.model_validate(valid_job("builtin", training=training, checkpoint={"everySteps": 2}))
    job = client.submit(model)
    status = job.wait(timeout=TIMEOUT)
    assert status.phase == "Succeeded" and status.last_checkpoint is not None
    events = [record["event"] for record in job.metrics()]
    assert events[0] == "start" and "step" in events and events[-1] == "done"
    # The built-in trainer's other ranks print only warnings: node 1's log holds nothing but its
    # torchrun agent's start-up mark (api.records.MARKS).
    node1 = [line.removeprefix("[node-1] ") for line in job.logs(rank=1)]
    assert all((record := parse_record(line)) is not None and record["event"] in MARKS for line in node1), node1


def test_a_failing_function_raises_from_wait_with_the_failure_in_status(client: Client) -> None:
    job = client.train(fails, nodes=2, args=("bad learning rate",), spec={"runPolicy": {"maxRestarts": 0}})
    with pytest.raises(JobFailed, match=r"failed \(BackoffLimitExceeded\)") as raised:
        job.wait(timeout=TIMEOUT)
    status = raised.value.status
    assert status.phase == "Failed" and status == job.status()
    (failure,) = status.failures or []
    assert failure.exit_code == 1 and "ValueError: bad learning rate" in failure.message
    assert "ValueError: bad learning rate" in str(raised.value)


def test_a_function_written_as_kubeflow_documents_it_succeeds(client: Client) -> None:
    # It calls init_process_group, barrier and destroy_process_group itself.
    job = client.train(kubeflow_ddp, nodes=2, args=(2,), spec={"runPolicy": {"maxRestarts": 0}})
    status = job.wait(timeout=TIMEOUT)
    assert status.phase == "Succeeded" and status.restarts == 0
    lines = job.logs()
    for rank in (0, 1):
        assert f"[node-{rank}] Distributed Training with WORLD_SIZE: 2, RANK: {rank}, LOCAL_RANK: 0." in lines
    assert "[node-0] Training is finished" in lines
    assert "[node-0] Train Epoch: 1 [0/256] Loss:" in "\n".join(lines)


def test_a_function_raising_the_same_error_again_fails_after_two_attempts(client: Client) -> None:
    job = client.train(fails, nodes=2, args=("bad learning rate",), spec={"runPolicy": {"maxRestarts": 3}})
    with pytest.raises(JobFailed, match=r"failed \(RepeatedError\)") as raised:
        job.wait(timeout=TIMEOUT)
    status = raised.value.status
    assert [f.attempt for f in status.failures or []] == [0, 1] and status.restarts == 1
    said = str(raised.value)
    assert "attempt 0 failed with the same error (ValueError: bad learning rate at " in said
    assert "function.py:" in said and "not restarted, a restart would raise it again" in said


def test_a_function_failing_differently_each_time_is_restarted(client: Client) -> None:
    job = client.train(fails_differently, nodes=2, spec={"runPolicy": {"maxRestarts": 1}})
    with pytest.raises(JobFailed, match=r"failed \(BackoffLimitExceeded\)") as raised:
        job.wait(timeout=TIMEOUT)
    status = raised.value.status
    assert [f.attempt for f in status.failures or []] == [0, 1] and status.restarts == 1


def test_what_cannot_run_is_refused_before_anything_is_created(client: Client, tmp_path: Path) -> None:
    root = Path(client.namespace)
    with pytest.raises(ShipError, match=r"the function .*<lambda> is a lambda: define it with `def`"):
        client.train(lambda: None, nodes=2)
    with pytest.raises(InvalidJob, match=r"spec.nodes: Input should be greater than or equal to 1"):
        client.train(all_reduce_ranks, nodes=0, args=(1,))
    with pytest.raises(InvalidJob, match=r"spec.runPolicy.maxRestart: unknown field"):
        client.submit({**valid_job("typo"), "spec": {**valid_job()["spec"], "runPolicy": {"maxRestart": 1}}})
    with pytest.raises(InvalidJob, match=r"spec.command: 'no-such-program' not found on PATH"):
        client.submit(fake_job("") | {"spec": {"nodes": 1, "command": ["no-such-program"]}})
    assert not root.exists() or list(root.iterdir()) == []
    with pytest.raises(JobNotFound, match=r"trainingjob nope not found in"):
        client.job("nope")


def test_follow_streams_a_running_job_and_delete_stops_it(client: Client) -> None:
    script = textwrap.dedent(
        """
        import os, time
        for i in range(3):
            print('tick', i, 'of', os.environ['NODE_RANK'], flush=True)
            time.sleep(0.5)
        time.sleep(300)
        """
    )
    job = client.submit(fake_job(script) | {"metadata": {"name": "ticks"}})
    with pytest.raises(AlreadyExists, match=r"trainingjob ticks already exists"):
        client.submit(fake_job("") | {"metadata": {"name": "ticks"}})
    with pytest.raises(WaitTimeout, match=r"trainingjob ticks is still (Pending|Running) after 1 s"):
        job.wait(timeout=1, progress=False)
    seen: list[str] = []
    for line in job.logs(follow=True):
        seen.append(line)
        if len(seen) == 6:
            break
    assert sorted(seen) == sorted(f"[attempt 0 node-{r}] tick {i} of {r}" for r in (0, 1) for i in range(3))
    # The node processes (pids.json: the supervisor's record of the current attempt's trees).
    roots = json.loads((Path(client.namespace) / "ticks" / "pids.json").read_text())["pids"]
    pids = [*roots, *(child.pid for root in roots for child in psutil.Process(root).children(recursive=True))]
    assert len(roots) == 2 and all(running(pid) for pid in pids)
    job.delete()
    assert not (Path(client.namespace) / "ticks").exists()
    wait_for(lambda: not any(running(pid) for pid in pids), 30, "the nodes' processes gone")
    with pytest.raises(JobNotFound):
        job.status()


def test_an_earlier_attempts_logs_and_a_run_of_the_command_read_from_its_files(tmp_path: Path) -> None:
    """A run directory `kubetrain run --local` left (another process: read-only for the client)."""
    marker = tmp_path / "failed-once"
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        print('attempt of node', os.environ['NODE_RANK'], flush=True)
        if os.environ['NODE_RANK'] == '1' and not pathlib.Path({str(marker)!r}).exists():
            pathlib.Path({str(marker)!r}).touch()
            sys.exit(3)
        """
    )
    done = finish_run(write_job(tmp_path, fake_job(script)), tmp_path / "runs" / "fake")
    assert done.returncode == 0, done.stdout
    job: Job = Client("local", run_dir=tmp_path / "runs").job("fake")
    assert job.wait(progress=False).restarts == 1
    printed = [line for line in done.stdout.splitlines() if line.startswith("[node-")]
    # The command printed both attempts; the client reads the current one, and attempt 0 on demand.
    assert job.logs() == ["[node-0] attempt of node 0", "[node-1] attempt of node 1"]
    assert sorted(job.logs(attempt=1) + job.logs(attempt=0)) == sorted(printed)
    with pytest.raises(LogsUnavailable, match=r"attempt 5: trainingjob fake in namespace \S+ has attempts 0-1"):
        job.logs(attempt=5)
    assert [record["event"] for record in job.metrics()] == []


def test_the_quickstart_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "client_quickstart.py"
    done = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Succeeded after 0 restarts" in out
    # Both ranks end with the same line fitted (DDP keeps the replicas equal), the one the data came from.
    fitted = dict(re.findall(r"^\[node-\d\] rank (\d) of 2: (y = .*)$", out, re.MULTILINE))
    assert sorted(fitted) == ["0", "1"] and fitted["0"] == fitted["1"], out
    weight, bias = (float(v) for v in re.findall(r"[\d.]+", fitted["0"]))
    assert abs(weight - 3) < 0.05 and abs(bias - 1) < 0.05, fitted
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == [
        str(s) for s in range(10, 101, 10)
    ]
    assert list((tmp_path / "runs").iterdir()) == []  # job.delete() took its run directory
