"""Teardown under load: consecutive 2-node `kubetrain run --local` runs with every core busy.

    .venv/bin/python benchmarks/teardown_stress.py [--runs 20] [--load N] [--workloads builtin,byo]

A finished run must look finished: one attempt, every node exiting 0, and no crash text in
any node's log. Teardown races (a rank aborting at exit, torchrun's exit barrier losing its
store) show up when the machine is saturated, so `--load` busy-loop processes (default: one
per core) run for the whole benchmark and are killed by PID at the end.

Workloads alternate run by run: `builtin` is the default pod command (`torchrun -m
kubetrain.trainer train`, a short digits job); `byo` is a plain script under a bare `torchrun`
(benchmarks/plain_ddp.py: `init_process_group("gloo")` from the env, no kubetrain import), so a
fix that needs a user's script to change would show here.

Counted per run, from the run directory: restarts (summary.json), node exit codes, and in
the node logs "terminate called" (a C++ abort), "exit barrier" (torchrun's agent losing the
store at its exit barrier) and "Traceback". Results go to benchmarks/results/teardown_stress.json
(or --output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
RESULT = ROOT / "benchmarks" / "results" / "teardown_stress.json"
MARKERS = {"terminate_called": "terminate called", "exit_barrier": "exit barrier", "traceback": "Traceback"}
RUN_TIMEOUT_S = 600


def job(workload: str) -> dict[str, Any]:
    """A short 2-node CPU TrainingJob; restarts allowed, so a teardown crash shows as a restart."""
    spec: dict[str, Any] = {
        "nodes": 2,
        "gpusPerNode": 0,
        "runPolicy": {"maxRestarts": 3},
        "checkpoint": {"dir": "/checkpoints"},
    }
    if workload == "builtin":
        spec["training"] = {"dataset": "digits", "epochs": 2, "batchSize": 32, "logEverySteps": 5}
        spec["checkpoint"]["everySteps"] = 20
    elif workload == "byo":
        spec["command"] = ["torchrun", str(ROOT / "benchmarks" / "plain_ddp.py")]
        spec["args"] = ["--steps", "60"]
    else:
        raise SystemExit(f"--workloads: unknown workload {workload!r} (builtin, byo)")
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"teardown-{workload}"},
        "spec": spec,
    }


@contextlib.contextmanager
def busy_load(processes: int) -> Iterator[list[int]]:
    """`processes` pure-Python busy loops; each is killed by its PID on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def scan_logs(run_dir: Path, markers: Mapping[str, str] = MARKERS) -> dict[str, int]:
    """How many lines of all node logs contain each marker (by default: the crash markers)."""
    counts = dict.fromkeys(markers, 0)
    for log in sorted(run_dir.glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            for key, text in markers.items():
                counts[key] += text in line
    return counts


def one_run(index: int, workload: str, scratch: Path) -> dict[str, Any]:
    job_file = scratch / f"{workload}.yaml"
    if not job_file.exists():
        job_file.write_text(yaml.safe_dump(job(workload)))
    run_dir = scratch / f"run-{index:03d}-{workload}"
    start = time.monotonic()
    proc = subprocess.run(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    markers = scan_logs(run_dir)
    result = {
        "run": index,
        "workload": workload,
        "exit_code": proc.returncode,
        "wall_s": round(time.monotonic() - start, 2),
        "outcome": summary.get("outcome"),
        "restarts": summary.get("restarts"),
        "failures": summary.get("failures", []),
        "markers": markers,
        "clean": proc.returncode == 0 and summary.get("restarts") == 0 and not any(markers.values()),
    }
    if not result["clean"]:
        result["log_tails"] = {log.name: log.read_text(errors="replace")[-4000:] for log in run_dir.glob("node-*.log")}
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


def totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": len(runs),
        "clean_runs": sum(r["clean"] for r in runs),
        "succeeded": sum(r["outcome"] == "Succeeded" for r in runs),
        "restarts": sum(r["restarts"] or 0 for r in runs),
        "runs_with_crash_text": sum(any(r["markers"].values()) for r in runs),
        **{f"lines_{key}": sum(r["markers"][key] for r in runs) for key in MARKERS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument("--workloads", default="builtin,byo", help="comma-separated, alternated run by run")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary dir)")
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for workload in workloads:
        job(workload)  # reject an unknown name before anything starts
    load_before = os.getloadavg()
    start = time.monotonic()
    runs = []
    with contextlib.ExitStack() as stack:
        scratch = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="teardown-stress-")))
        scratch.mkdir(parents=True, exist_ok=True)
        stack.enter_context(busy_load(args.load))
        for index in range(args.runs):
            result = one_run(index, workloads[index % len(workloads)], scratch)
            runs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k not in ("log_tails", "stderr_tail")}), flush=True)
    report = {
        "benchmark": "teardown_stress",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "logical_cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": _torch_version(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "setup": {"runs": args.runs, "busy_loops": args.load, "workloads": workloads},
        "wall_s": round(time.monotonic() - start, 1),
        "totals": totals(runs),
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["totals"], indent=2))


def _torch_version() -> str:
    # Without importing torch here: the runs must not share this process's start-up cost.
    from importlib.metadata import version

    return version("torch")


if __name__ == "__main__":
    main()
