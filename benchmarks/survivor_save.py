"""Steps lost and seconds to training again when a worker dies, with the survivor's save and without.

`kubetrain run examples/digits-cpu.yaml --local` (2 nodes, 3 epochs of 22 steps, saved at each
epoch end only), node 1's worker SIGKILLed after step 30 (`KUBETRAIN_FAULT=kill,rank=1,step=30`),
the in-place restart. Two variants, alternating within each pair of runs, in one invocation:

- `survivor`: as shipped: node 0's worker saves step 30 before the gang restarts
  (kubetrain.runtime.worker.survivor);
- `off`: the same job with `KUBETRAIN_SURVIVOR=off` in its command (what every job did before):
  the gang resumes from the epoch's save, step 22.

Per run: steps lost = 30 - the step attempt 1 resumed from; seconds to training again = the
timeline's failedAt -> firstStepAt of attempt 1 (status.json, as on a cluster).

    .venv/bin/python benchmarks/survivor_save.py [--repeats 3] [--output FILE]

Writes benchmarks/results/survivor_save.json (or --output).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from machine import paired_arguments, paired_runs, report_head, write_report

from kubetrain.api.contract import DEFAULT_COMMAND
from kubetrain.api.records import records_in

ROOT = Path(__file__).resolve().parent.parent
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
RESULTS = ROOT / "benchmarks" / "results" / "survivor_save.json"
FAULT_STEP = 30
VARIANTS = ("survivor", "off")


def job_file(directory: Path, variant: str) -> Path:
    documents = yaml.safe_load_all((ROOT / "examples" / "digits-cpu.yaml").read_text())
    job = next(doc for doc in documents if doc and doc.get("kind") == "TrainingJob")
    spec = job["spec"]
    spec["training"].update(epochs=3, logEverySteps=1)
    spec["checkpoint"].pop("everySteps", None)
    spec["env"] = [{"name": "KUBETRAIN_FAULT", "value": f"kill,rank=1,step={FAULT_STEP}"}]
    if variant == "off":
        spec["command"] = ["env", "KUBETRAIN_SURVIVOR=off", *DEFAULT_COMMAND]
    path = directory / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_once(directory: Path, variant: str, index: int) -> dict[str, Any]:
    run_dir = directory / f"{variant}-{index}"
    started = time.monotonic()
    done = subprocess.run(
        [KUBETRAIN, "run", str(job_file(directory, variant)), "--local", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    if done.returncode != 0:
        output = done.stdout[-3000:] + done.stderr[-2000:]
        raise RuntimeError(f"{variant} run {index} exited {done.returncode}:\n{output}")
    status = json.loads((run_dir / "status.json").read_text())
    metrics = records_in((run_dir / "checkpoints" / "metrics.jsonl").read_text())
    (resume,) = [r for r in metrics if r["event"] == "resume"]
    line = status["timeline"]
    return {
        "variant": variant,
        "resumed_step": resume["step"],
        "resumed_reason": resume.get("reason"),
        "steps_lost": FAULT_STEP - resume["step"],
        "failure_to_training_s": round(_at(line["firstStepAt"]) - _at(line["failedAt"]), 3),
        "run_s": round(time.monotonic() - started, 1),
        "restarts": status.get("restarts"),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {v: [r for r in runs if r["variant"] == v] for v in VARIANTS}
    summary: dict[str, Any] = {
        v: {
            "steps_lost": [r["steps_lost"] for r in rs],
            "failure_to_training_s": [r["failure_to_training_s"] for r in rs],
            "median_failure_to_training_s": statistics.median(r["failure_to_training_s"] for r in rs),
        }
        for v, rs in by.items()
    }
    summary["ratio_failure_to_training_survivor_over_off"] = round(
        summary["survivor"]["median_failure_to_training_s"] / summary["off"]["median_failure_to_training_s"], 3
    )
    return summary


def main() -> None:
    args = paired_arguments(__doc__ or "", RESULTS)
    load_before = os.getloadavg()
    runs = paired_runs(args, VARIANTS, run_once, prefix="kubetrain-survivor-")
    result = {
        **report_head("survivor_save", load_before),
        "fault_step": FAULT_STEP,
        "runs": runs,
        "summary": summarize(runs),
    }
    write_report(args.output, result)


if __name__ == "__main__":
    main()
