"""Hang detection on a loaded machine: a slow job that still progresses is never Stalled, a hung one is.

    .venv/bin/python benchmarks/stall_false_positives.py [--runs 10] [--timeout 20] [--step-ms 3000]

Runs `--runs` consecutive 2-node `kubetrain run --local` jobs of the built-in trainer (digits,
a record every step) with `runPolicy.hangTimeoutSeconds: --timeout` while `--load` busy-loop
processes (default: one per core) saturate the machine. Rank 0 of every run is slowed from
step 1 on (KUBETRAIN_FAULT `slow,rank=0,step=1,ms=--step-ms`): each step is slow but well
inside the timeout, so the job never stops progressing. Counted per run, from its run
directory: Stalled conditions and Stalled failures (status.json), restarts, and the
watchdog's stack dumps ("Timeout (0:" lines in the node logs, written by a rank that went
half the timeout without a step). Expected: none of any. A Stalled failure is told apart by
its message: in start-up (rank 0 had reported nothing in that attempt: the clock runs from
the pods' Running, through interpreter start, imports, rendezvous and model build) or after
progress began. The time from the launch to rank 0's first record and the longest gap
between records of one attempt say how close each run came to the timeout.

Then once the opposite (`--hang-check`, on by default): rank 1 blocks outside any collective
at step 3 (KUBETRAIN_FAULT `hang,rank=1,step=3`) under the same load. Expected: the job goes
Stalled, the failure names rank 1 and the line it hangs on, both nodes' logs hold stacks,
and the restarted attempt (the fault fires once) finishes.

Results go to benchmarks/results/stall_false_positives.json (or --output) with the load averages.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from machine import report_head

from kubetrain.api.records import records_in

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.local_runs import finish_run  # noqa: E402
from teardown_stress import busy_load, scan_logs  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "stall_false_positives.json"
DUMP = {"stack_dumps": "Timeout (0:"}
# In a Stalled failure's message when rank 0 reported nothing since its attempt started running
# (runPolicy.startupTimeoutSeconds; before that field, the message said "none since attempt N").
STARTUP = "wrote no record within startupTimeoutSeconds"
HANG_STEP = 3


def job(name: str, timeout: int, steps: int, fault: str, max_restarts: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "nodes": 2,
            "gpusPerNode": 0,
            "training": {"dataset": "digits", "epochs": 1, "maxSteps": steps, "batchSize": 32, "logEverySteps": 1},
            "checkpoint": {"dir": "/checkpoints"},
            "runPolicy": {"maxRestarts": max_restarts, "hangTimeoutSeconds": timeout},
            "env": [{"name": "KUBETRAIN_FAULT", "value": fault}],
        },
    }


def one_run(job_doc: dict[str, Any], run_dir: Path, run_timeout: float) -> dict[str, Any]:
    job_file = run_dir.with_suffix(".yaml")
    job_file.write_text(yaml.safe_dump(job_doc))
    load = os.getloadavg()
    launched = time.time()
    proc = finish_run(job_file, run_dir, timeout=run_timeout)
    status_file = run_dir / "status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else {}
    stalled = [c for c in status.get("conditions", []) if c["type"] == "Stalled"]
    failures = status.get("failures", [])
    metrics = run_dir / "checkpoints" / "metrics.jsonl"
    records = records_in(metrics.read_text()) if metrics.exists() else []
    # Gaps between rank 0's records within an attempt (each attempt's records begin with `start`).
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(records) if b["event"] != "start"]
    steps = [r for r in records if r["event"] == "step"]
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return {
        "exit_code": proc.returncode,
        "outcome": summary.get("outcome"),
        "restarts": status.get("restarts"),
        "stalled_conditions": len(stalled),
        "stalled_condition": stalled[0] if stalled else None,
        "stalled_failures": sum(f["reason"] == "Stalled" for f in failures),
        # The failure's message says whether rank 0 had reported anything in that attempt.
        "stalled_in_startup": sum(f["reason"] == "Stalled" and STARTUP in f["message"] for f in failures),
        "failures": failures,
        **scan_logs(run_dir, DUMP),
        "steps": len(steps),
        "launch_to_first_record_s": round(records[0]["time"] - launched, 2) if records else None,
        "longest_between_records_s": round(max(gaps), 2) if gaps else None,
        "median_step_s": round(sorted(s["step_time_s"] for s in steps)[len(steps) // 2], 3) if steps else None,
        "load_average_1m_before": round(load[0], 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        **({"output_tail": proc.stdout[-2000:]} if proc.returncode != 0 else {}),
    }


def hang_verdict(run: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """What the hang run showed: Stalled, blamed on rank 1 with its line, stacks of both nodes."""
    stalled = [f for f in run["failures"] if f["reason"] == "Stalled"]
    message = stalled[0]["message"] if stalled else ""
    return {
        "stalled": bool(stalled),
        "blamed_rank": stalled[0]["rank"] if stalled else None,
        "names_rank_1": "rank 1 not in the collective" in message,
        "names_the_line": "kubetrain/trainer/faults.py:" in message,
        "nodes_with_stacks": [n for n in (0, 1) if DUMP["stack_dumps"] in (run_dir / f"node-{n}.log").read_text()],
        "message": message,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=int, default=20, help="runPolicy.hangTimeoutSeconds")
    parser.add_argument("--step-ms", type=int, default=3000, help="rank 0's extra time per step")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (training.maxSteps)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument("--no-hang-check", dest="hang_check", action="store_false", help="skip the real hang")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary dir)")
    args = parser.parse_args()
    if args.step_ms >= args.timeout * 1000:
        raise SystemExit(f"--step-ms {args.step_ms} must be well below --timeout {args.timeout} s")
    load_before = os.getloadavg()
    start = time.monotonic()
    # Every step plus start-up, with room for a stall and a restart: a run that takes longer hangs.
    run_timeout = 300 + args.steps * args.step_ms / 1000 + 2 * args.timeout
    slow = job("slow-steps", args.timeout, args.steps, f"slow,rank=0,step=1,ms={args.step_ms}", 3)
    runs: list[dict[str, Any]] = []
    hang: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        scratch = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stall-fp-")))
        scratch.mkdir(parents=True, exist_ok=True)
        stack.enter_context(busy_load(args.load))
        for index in range(args.runs):
            runs.append(one_run(slow, scratch / f"slow-{index:02d}", run_timeout))
            print(json.dumps({"run": index, **{k: v for k, v in runs[-1].items() if k != "failures"}}), flush=True)
        if args.hang_check:
            hung = job("hang", args.timeout, args.steps, f"hang,rank=1,step={HANG_STEP}", 1)
            run = one_run(hung, scratch / "hang", run_timeout)
            hang = {**run, "verdict": hang_verdict(run, scratch / "hang")}
            print(json.dumps({"hang": hang["verdict"]}), flush=True)
    report = {
        **report_head("stall_false_positives", load_before),
        "setup": {
            "runs": args.runs,
            "hang_timeout_seconds": args.timeout,
            "slow_ms_per_step_rank0": args.step_ms,
            "steps": args.steps,
            "busy_loops": args.load,
        },
        "wall_s": round(time.monotonic() - start, 1),
        "totals": {
            "runs": len(runs),
            "succeeded": sum(r["outcome"] == "Succeeded" for r in runs),
            "stalled_conditions": sum(r["stalled_conditions"] for r in runs),
            "stalled_failures": sum(r["stalled_failures"] for r in runs),
            "restarts": sum(r["restarts"] or 0 for r in runs),
            "stalled_in_startup": sum(r["stalled_in_startup"] for r in runs),
            "stalled_after_progress": sum(r["stalled_failures"] - r["stalled_in_startup"] for r in runs),
            "stack_dump_lines": sum(r["stack_dumps"] for r in runs),
            "launch_to_first_record_s": sorted(r["launch_to_first_record_s"] or 0 for r in runs),
            "longest_between_records_s": max((r["longest_between_records_s"] or 0 for r in runs), default=None),
        },
        "runs": runs,
        "hang_check": hang,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"totals": report["totals"], "hang": hang and hang["verdict"]}, indent=2))


if __name__ == "__main__":
    main()
