"""Command -> first training step of `kubetrain run examples/digits-cpu.yaml --local` (2 nodes).

Each repeat launches the real command (logging every step), takes the wall time from just
before the launch to rank 0's first `step` record (its `time` field, written after the
first optimizer step), then stops the run with SIGINT. As a floor for the same machine and
moment, `python -c "import torch"` is timed in between: every node runs torchrun and one
worker, so 4 processes import torch before the first step.

    .venv/bin/python benchmarks/local_startup.py [--repeats 5] [--output FILE]

Writes benchmarks/results/local_startup.json (or --output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from kubetrain.api.records import records_in

ROOT = Path(__file__).resolve().parent.parent
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
RESULTS = ROOT / "benchmarks" / "results" / "local_startup.json"


def first_records(metrics: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, float]:
    """Unix times of the first start and step records."""
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists():
            for record in records_in(metrics.read_text()):
                seen.setdefault(record["event"], record["time"])
            if "step" in seen:
                return seen
        time.sleep(0.01)
    raise RuntimeError(f"no step record within {timeout}s (exit code {proc.poll()})")


def one_run(job_file: Path, run_dir: Path) -> dict[str, float]:
    started = time.time()
    proc = subprocess.Popen(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    spawned: list[float] = []

    def watch() -> None:
        # The runner's own share: launch -> it has validated, rendered and started the nodes.
        assert proc.stdout is not None
        for line in proc.stdout:
            if not spawned and line.startswith(b"[kubetrain] attempt 0:"):
                spawned.append(time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        seen = first_records(run_dir / "checkpoints" / "metrics.jsonl", proc, timeout=300)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        watcher.join(timeout=10)
    return {
        "to_nodes_started_s": spawned[0] - started,
        "to_start_record_s": seen["start"] - started,
        "to_first_step_s": seen["step"] - started,
    }


def import_torch_s() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    job = next(
        d for d in yaml.safe_load_all((ROOT / "examples/digits-cpu.yaml").read_text()) if d["kind"] == "TrainingJob"
    )
    job["spec"]["training"].update(logEverySteps=1, epochs=1000)
    runs: list[dict[str, float]] = []
    floors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        job_file = Path(tmp) / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        for repeat in range(args.repeats):
            floors.append(import_torch_s())
            runs.append(one_run(job_file, Path(tmp) / f"run-{repeat}"))
            print(f"repeat {repeat}: {runs[-1]} (import torch alone {floors[-1]:.2f}s)", flush=True)

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values), 2),
            "min": round(min(values), 2),
            "max": round(max(values), 2),
        }

    result: dict[str, Any] = {
        "benchmark": "kubetrain run examples/digits-cpu.yaml --local: command -> first training step",
        "nodes": 2,
        "processes_importing_torch": 4,
        "repeats": args.repeats,
        "to_first_step_s": stats([r["to_first_step_s"] for r in runs]),
        "to_nodes_started_s": stats([r["to_nodes_started_s"] for r in runs]),
        "to_start_record_s": stats([r["to_start_record_s"] for r in runs]),
        "import_torch_alone_s": stats(floors),
        "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "torch": subprocess.run(
                [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
            ).stdout.strip(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_s")}))


if __name__ == "__main__":
    main()
