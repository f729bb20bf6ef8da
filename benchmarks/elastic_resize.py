"""Seconds to training again when a node is lost, and when it comes back: an elastic gang resized in
place against a gang of a fixed size recreated, side by side in one invocation.

`kubetrain run --local`, 3 nodes training digits (global batch 96, no periodic saves), node 2's
process tree (its torchrun agent and its worker) SIGKILLed once the gang passed step KILL_STEP: the
local stand-in for a pod lost with its node. Once measured, the run is stopped with Ctrl-C (SIGINT,
the stop vote saves the step it is at): the job is long enough that no load ends it before node 2
is back (it once did in CI, and the benchmark waited for a growth that never came). Two
variants, alternating within each pair of runs:

- `elastic`: spec.elastic {minNodes: 2, scaleUpCooldownSeconds: 0}. The gang shrinks to 2 in place;
  node 2, started again, waits on standby and the gang grows back to 3 at its next step boundary.
  shrink_s = the kill -> the first step at 2; grow_s = node 2's agent on standby (its `standby`
  record: capacity back) -> the first step at 3; grow_stall_s = the gang's last step at 2 -> its
  first at 3 (what the growth costs the training: the gang trains on at 2 until it is ordered).
  A node on standby imports its workers' modules before it announces itself, so both start
  after that import.
- `fixed`: the same job without a range (what every job did before): the lost node recreates the
  whole gang. recreate_s = the kill -> the first step of the recreated gang.

Steps lost per run: the steps trained twice (the per-step sample ledger, KUBETRAIN_SAMPLE_LEDGER).

    .venv/bin/python benchmarks/elastic_resize.py [--repeats 3] [--output FILE]

Writes benchmarks/results/elastic_resize.json (or --output).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import yaml
from machine import paired_arguments, paired_runs, report_head, write_report

from kubetrain.api.contract import LEDGER_ENV
from kubetrain.api.records import records_in
from kubetrain.local.result import EXIT_SIGNAL_BASE
from kubetrain.trainer.ledger import read

ROOT = Path(__file__).resolve().parent.parent
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
RESULTS = ROOT / "benchmarks" / "results" / "elastic_resize.json"
VARIANTS = ("elastic", "fixed")
KILL_STEP = 60
RUN_DEADLINE_S = 240  # per run, from its start to its stop (one takes ~30 s on 2 idle cores)
STOP_S = 60


def job(directory: Path, variant: str) -> Path:
    spec: dict[str, Any] = {
        "nodes": 3,
        "env": [{"name": LEDGER_ENV, "value": str(directory / "ledger")}],
        "training": {
            "dataset": "digits",
            "epochs": 1000,  # never reached: stopped once measured
            "batchSize": 32,
            "globalBatchSize": 96,
            "seed": 5,
            "logEverySteps": 1,
        },
        "checkpoint": {"dir": "/checkpoints", "keep": 2},
    }
    if variant == "elastic":
        spec["elastic"] = {"minNodes": 2, "scaleUpCooldownSeconds": 0}
    path = directory / "job.yaml"
    document = {"apiVersion": "kubetrain.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": variant}}
    path.write_text(yaml.safe_dump({**document, "spec": spec}))
    return path


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads((run_dir / "status.json").read_text())
        return found
    except (OSError, ValueError):
        return {}


class Rank0Log:
    """Rank 0's records (node 0's log), read on as the run writes them. Read from the log and not
    from status.json: an attempt may train for less than a poll of the status (node 2 back on
    standby before the smaller gang's first step: it grows at once, the cool-down being 0)."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.offset = run_dir / "node-0.log", 0
        self.records: list[dict[str, Any]] = []
        self.sizes: dict[int, int] = {}  # attempt -> its world size, from its `start` record

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return self.records
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(whole)
        new = records_in(whole.decode(errors="replace"))
        self.sizes.update((int(r["attempt"]), int(r["world_size"])) for r in new if r["event"] == "start")
        self.records += new
        return self.records

    def first_step(
        self, proc: subprocess.Popen[bytes], attempt_after: int, size: int | None, deadline: float
    ) -> tuple[int, float]:
        """(attempt, time of its first step) of the first attempt after `attempt_after` that
        trained (at `size` nodes, when given)."""
        scanned = 0  # each poll looks at the records it has not seen: it runs beside the measured run
        while time.monotonic() < deadline and proc.poll() is None:
            records = self.read()
            for r in records[scanned:]:
                attempt = r.get("attempt", 0)
                if r["event"] == "step" and attempt > attempt_after and size in (None, self.sizes.get(attempt)):
                    return int(attempt), float(r["time"])
            scanned = len(records)
            time.sleep(0.05)
        ended = "in time" if proc.poll() is None else f"before the run exited {proc.returncode}"
        at = "" if size is None else f" at {size} nodes"
        raise RuntimeError(f"no attempt after {attempt_after} trained{at} {ended}")

    def last_step(self, attempt: int) -> float:
        """When rank 0 logged its last step of `attempt` (every step is logged)."""
        return max(float(r["time"]) for r in self.read() if r["event"] == "step" and r.get("attempt") == attempt)


def _where(run_dir: Path) -> str:
    """What a failed run left: its status and the end of each node's log."""
    status = _status(run_dir)
    step, waiting = (status.get("progress") or {}).get("step"), (status.get("timeline") or {}).get("waitingOn")
    lines = [
        f"status: phase {status.get('phase')}, attempt {status.get('attempt')}, size {status.get('size')}, "
        f"step {step}, waiting on {waiting!r}"
    ]
    for log in sorted(run_dir.glob("node-*.log")):
        tail = log.read_text(errors="replace").splitlines()[-6:]
        lines += [f"--- {log.name}", *(line[:300] for line in tail)]
    return "\n".join(lines)


def _standby_time(run_dir: Path) -> float:
    """When node 2's agent, started again, waited on standby (its log's last `standby` record)."""
    found = [r for r in records_in((run_dir / "node-2.log").read_text()) if r["event"] == "standby"]
    if not found:
        raise RuntimeError(f"{run_dir.name}: node 2 never waited on standby")
    return float(found[-1]["time"])


def run_once(directory: Path, variant: str, index: int) -> dict[str, Any]:
    where = directory / f"{variant}-{index}"
    where.mkdir(parents=True)
    run_dir = where / "run"
    proc = subprocess.Popen(
        [KUBETRAIN, "run", str(job(where, variant)), "--local", "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    result: dict[str, Any] = {"variant": variant}
    try:
        deadline = time.monotonic() + RUN_DEADLINE_S
        while ((_status(run_dir).get("progress") or {}).get("step") or 0) < KILL_STEP:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"never reached step {KILL_STEP}")
            time.sleep(0.02)
        attempt = int(_status(run_dir)["attempt"])
        node2 = json.loads((run_dir / "pids.json").read_text())["pids"][2]
        root = psutil.Process(node2)
        doomed = [root, *root.children(recursive=True)]
        killed = time.time()
        for member in doomed:
            member.kill()
        rank0 = Rank0Log(run_dir)
        if variant == "elastic":
            shrunk, at = rank0.first_step(proc, attempt, 2, deadline)
            result["shrink_s"] = round(at - killed, 3)
            _, grown_at = rank0.first_step(proc, shrunk, 3, deadline)
            result["grow_s"] = round(grown_at - _standby_time(run_dir), 3)
            result["grow_stall_s"] = round(grown_at - rank0.last_step(shrunk), 3)
        else:
            _, at = rank0.first_step(proc, attempt, None, deadline)
            result["recreate_s"] = round(at - killed, 3)
        proc.send_signal(signal.SIGINT)  # measured: Ctrl-C, which saves the step the gang is at
        if proc.wait(timeout=STOP_S) != EXIT_SIGNAL_BASE + signal.SIGINT:
            raise RuntimeError(f"stopped with Ctrl-C, it exited {proc.returncode}")
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{variant} run {index}: {error}\n{_where(run_dir)}") from error
    finally:
        if proc.poll() is None:
            proc.kill()
    status = _status(run_dir)
    trained = Counter((line["step"], line["rank"]) for line in read(where / "ledger"))
    result["steps_lost"] = len({step for (step, _), count in trained.items() if count > 1})
    result["restarts"] = status.get("restarts")
    result["resizes"] = [(r["fromSize"], r["toSize"]) for r in status.get("resizes") or []]
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["variant"] == variant)

    shrink, grow, recreate = median("elastic", "shrink_s"), median("elastic", "grow_s"), median("fixed", "recreate_s")
    return {
        "median_shrink_s": shrink,
        "median_grow_s": grow,
        "median_grow_stall_s": median("elastic", "grow_stall_s"),
        "median_recreate_s": recreate,
        "steps_lost": {v: [r["steps_lost"] for r in runs if r["variant"] == v] for v in VARIANTS},
        "ratio_shrink_over_recreate": round(shrink / recreate, 3),
        "ratio_grow_over_recreate": round(grow / recreate, 3),
    }


def main() -> None:
    args = paired_arguments(__doc__ or "", RESULTS)
    load_before = os.getloadavg()
    runs = paired_runs(args, VARIANTS, run_once, prefix="kubetrain-elastic-")
    result = {
        **report_head("elastic_resize", load_before),
        "kill_step": KILL_STEP,
        "runs": runs,
        "summary": summarize(runs),
    }
    write_report(args.output, result)


if __name__ == "__main__":
    main()
