"""The stop vote (kubetrain.runtime.worker.stopping) with two gloo ranks: spaced out while steps are fast
(a vote costs about as much CPU as a README-sized step, benchmarks/stop_on_signal.py), after
every step once steps are slow, and a SIGTERM to one rank still stops both at the same step,
soon after steps suddenly slow down too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.trainer_runs import Launcher

from kubetrain.runtime.worker.stopping import VOTE_INTERVAL_S

pytestmark = pytest.mark.train

CHECKS = [str(Path(__file__).with_name("stop_vote_checks.py"))]


def test_votes_are_spaced_and_a_signal_stops_every_rank_at_one_step(launcher: Launcher) -> None:
    results = launcher.ranks(2, CHECKS).wait(180)
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-3000:]}"
    ranks = json.loads(results[0][1].strip().splitlines()[-1])
    for rank in ranks:
        # 1 ms steps: a vote every step would be 1.0; every MAX_STEPS_PER_VOTE (16) is ~0.06.
        assert rank["fast"] < 0.25, rank
        # Steps longer than the interval: a vote after every one, as before.
        assert rank["slow"] == 1.0, rank
    stops = [rank["stop"] for rank in ranks]
    assert stops[0]["call"] == stops[1]["call"] > 100, stops  # the same step on both ranks
    # About two intervals after rank 1's signal (0.2-0.5 s); generous for a loaded machine.
    assert stops[1]["after_signal_s"] < 20 * 2 * VOTE_INTERVAL_S, stops
    # Steps 50x slower all at once (the spacing was fitted to 1 ms steps): the signal still stops
    # both ranks at the same step within two intervals of at most 16 steps (a spacing of 100
    # steps, as first shipped, took 152 slow steps here).
    after = [rank["after_slowdown"] for rank in ranks]
    assert after[0] == after[1] <= 2 * 16 + 1, after


STUCK = """
import os, signal, sys, time, types
from kubetrain.runtime.worker import stopping
stopping.STUCK_AFTER_S = 1.0
stop = stopping.StopSignal(types.SimpleNamespace(world_size=1, backend="gloo"))
for _ in range(3):
    assert not stop.agreed()
os.kill(os.getpid(), signal.SIGTERM)
if sys.argv[1] == "reaches":
    assert stop.agreed()  # the boundary: the stop is agreed, its save may take long
time.sleep(3)
print("still here", flush=True)
"""


@pytest.mark.parametrize(("where", "code", "said"), [("stuck", 143, "no step boundary reached"), ("reaches", 0, "")])
def test_a_signalled_rank_that_reaches_no_step_boundary_exits_instead_of_waiting_for_sigkill(
    where: str, code: int, said: str
) -> None:
    done = subprocess.run([sys.executable, "-c", STUCK, where], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr[-2000:]
    assert said in done.stderr and ("still here" in done.stdout) == (code == 0)
