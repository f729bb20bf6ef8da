"""A Stalled gang names the rank that hung, from every rank's stacks: rank 1 of 3 blocks outside
any collective in a script of its own, under a bare torchrun, through `kubetrain run --local`;
the script either uses kubetrain.trainer.lib and its watchdog or imports nothing of kubetrain."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from support.jobs import bare_job, write_job
from support.local_runs import finish_run, run_status
from support.workloads import hang_rank1, plain_hang_rank1

from kubetrain.operator.conditions import get_condition

pytestmark = pytest.mark.train

SCRIPTS = [Path(inspect.getfile(hang_rank1)), Path(inspect.getfile(plain_hang_rank1))]


def hang_line(script: Path) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if "the culprit's line" in line)


def hang_job(script: Path, hang_timeout: int) -> dict[str, object]:
    run_policy = {"maxRestarts": 1, "hangTimeoutSeconds": hang_timeout}
    return bare_job("hang", nodes=3, command=["torchrun", str(script)], runPolicy=run_policy)


@pytest.mark.parametrize("script", SCRIPTS, ids=["lib-watchdog", "plain-ddp"])
def test_the_stalled_failure_names_rank_1_and_its_line(tmp_path: Path, script: Path) -> None:
    # The timeout counts from the gang's start: three torch processes starting on a loaded 2-core
    # machine took over 30 s to report their first step.
    done = finish_run(write_job(tmp_path, hang_job(script, 60)), tmp_path / "run", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:]
    status = run_status(tmp_path / "run")
    assert (status.attempt, status.restarts) == (1, 1), status
    (failure,) = status.failures or []
    assert (failure.reason, failure.rank, failure.pod) == ("Stalled", 1, "hang-node-1")
    where = f"{script}:{hang_line(script)} in block_forever"
    assert "rank 1 not in the collective ranks 0, 2 wait in" in failure.message, failure.message
    assert where in failure.message, failure.message
    stalled = get_condition(status, "Stalled")
    assert stalled is not None and stalled.reason == "ProgressResumed", "the resumed attempt progressed"
    # Every rank's stacks are in its node's log, the hung rank's with the line it hung on.
    for rank in range(3):
        log = (tmp_path / "run" / f"node-{rank}.log").read_text()
        assert "Timeout (0:00:30)!" in log, f"node {rank} wrote no stacks"
    assert (
        f'File "{script}", line {hang_line(script)} in block_forever' in (tmp_path / "run" / "node-1.log").read_text()
    )
    # The resumed attempt's progress reached status, to its last step, from records the plain
    # script never wrote itself (its optimizer steps).
    assert status.progress is not None and status.progress.step == 12, status.progress
