"""What the runtime's injection costs at pod start, on the real node (docs/images.md).

The same TrainingJob (digits, 2 nodes, the trainer image, the operator from this tree on the
host) with spec.runtime.inject true (the default: the `kubetrain-runtime` init container copies
the runtime into an emptyDir, PYTHONPATH starts with its loader) and false (the image's own .pth
alone), alternating, so each pair meets the same load. The trainer image has kubetrain, so both
train alike and only the start differs. Measured, from the job's creation (host clock, the API
polled every 0.1 s):

  ready_s          until both pods are Ready (each torchrun agent runs its workers)
  start_s          until rank 0's `start` record (process group, data and model ready), from its time
  init_container_s the init container's own run, from its status (whole seconds: the kubelet's resolution)

    sudo .venv/bin/python benchmarks/runtime_injection.py [--repeats 5] [--output FILE]

Needs root, the real node's binaries and the images (tests/cluster/build-images.sh). Writes
benchmarks/results/runtime_injection.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from support.realjobs import RealJobs, ready, real_jobs, records  # noqa: E402
from support.waiting import wait_for  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "runtime_injection.json"
NAMESPACE = "injection"


def _seconds(start: str, end: str) -> float:
    parse = datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def measure(jobs: RealJobs, name: str, inject: bool) -> dict[str, Any]:
    created_wall, created = time.time(), time.monotonic()
    # Long enough to be running while it is watched; deleted once measured.
    volume = jobs.create(name, inject_runtime=inject, training={"epochs": 50})
    pods = wait_for(lambda: len(p := jobs.pod_objects(name)) == 2 and all(map(ready, p)) and p, 600, f"{name} Ready")
    ready_s = time.monotonic() - created
    start = wait_for(lambda: next((r for r in records(volume) if r["event"] == "start"), None), 600, "start")
    init = []
    for pod in pods:
        for status in pod["status"].get("initContainerStatuses") or []:
            done = (status.get("state") or {}).get("terminated") or {}
            init.append(_seconds(done["startedAt"], done["finishedAt"]))
    jobs.delete(name)
    return {
        "inject": inject,
        "ready_s": round(ready_s, 2),
        "start_s": round(start["time"] - created_wall, 2),
        "init_container_s": init,
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per mode and of the pairs' differences (inject minus not, run i with run i's pair)."""
    by_mode = {inject: [r for r in runs if r["inject"] is inject] for inject in (True, False)}
    summary: dict[str, Any] = {}
    for key in ("ready_s", "start_s"):
        pairs = [a[key] - b[key] for a, b in zip(by_mode[True], by_mode[False], strict=False)]
        summary[key] = {
            "inject_median": statistics.median(r[key] for r in by_mode[True]),
            "no_inject_median": statistics.median(r[key] for r in by_mode[False]),
            "pair_difference_median": round(statistics.median(pairs), 2),
            "pair_differences": [round(d, 2) for d in pairs],
        }
    seconds = [s for r in by_mode[True] for s in r["init_container_s"]]
    summary["init_container_s_median"] = statistics.median(seconds) if seconds else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    # SIGTERM (a `kill`, a CI timeout) unwinds like an exception, so the node, the operator and their
    # mounts are torn down: killed outright, this process left operators and kubelet mounts behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work, real_jobs(Path(work), NAMESPACE, overlay=False) as jobs:
        for repeat in range(args.repeats):
            # Alternate which goes first, so neither always meets the other's leftovers.
            for inject in (True, False) if repeat % 2 == 0 else (False, True):
                run = measure(jobs, f"start-{repeat}-{'on' if inject else 'off'}", inject)
                print(json.dumps(run), flush=True)
                runs.append(run)
    result = {"runs": runs, "summary": summarize(runs), "cpus": os.cpu_count()}
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
