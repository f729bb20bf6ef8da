"""Where kubetrain's operator spends CPU and memory under operator_latency.py's load (default
200 jobs x 4 nodes), on one fresh control plane, in two passes so that neither tool skews the
other:

  cpu     py-spy (`pip install py-spy`; --py-spy names the binary) samples the operator while
          the load runs (non-blocking, idle threads excluded): top functions by own samples
          and by inclusive samples, as shares of all samples.
  memory  tracemalloc from the operator's start-up (benchmarks/profiling/sitecustomize.py): what
          is still held when it stops after the load, by line and by package.

    .venv/bin/python benchmarks/profile_operator.py [--jobs 200] [--nodes 4] [--py-spy py-spy]

Writes benchmarks/results/operator_profile.json (the raw collapsed stacks go to a temporary directory,
named in it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import measure  # noqa: E402
from operator_latency import measure_one  # noqa: E402
from peers import KubetrainPeer  # noqa: E402
from support.waiting import wait_for  # noqa: E402


class SampledPeer(KubetrainPeer):
    """kubetrain's operator with py-spy attached from its start to its exit."""

    def __init__(self, py_spy: str, stacks: Path) -> None:
        super().__init__()
        self.py_spy, self.stacks = py_spy, stacks
        self.sampler: subprocess.Popen[bytes] | None = None

    def start(self, cp: Any, namespace: str, log_path: Path) -> None:
        super().start(cp, namespace, log_path)
        args = [self.py_spy, "record", "--pid", str(self.pid()), "--format", "raw", "--nonblocking"]
        self.sampler = subprocess.Popen([*args, "--rate", "200", "-o", str(self.stacks)], stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        super().stop()
        if self.sampler is not None:
            self.sampler.wait(60)  # py-spy writes its output once the target exited


class TracedPeer(KubetrainPeer):
    """kubetrain's operator under tracemalloc (sitecustomize), dumping on SIGUSR1 before it stops."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def start(self, cp: Any, namespace: str, log_path: Path) -> None:
        saved = dict(os.environ)
        os.environ["PYTHONPATH"] = str(ROOT / "benchmarks" / "profiling")
        os.environ["KUBETRAIN_TRACEMALLOC_OUT"] = str(self.out)
        try:
            super().start(cp, namespace, log_path)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def stop(self) -> None:
        if self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.send_signal(signal.SIGUSR1)
            wait_for(self.out.exists, 120, f"the tracemalloc snapshot {self.out}")
        super().stop()


def frame_name(frame: str) -> str:
    """`func (path/to/file.py:12)` -> `func (file.py)`: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else name


def summarize_stacks(path: Path, top: int = 25) -> dict[str, Any]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples

    def shares(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "share": round(n / total, 4)} for f, n in counter.most_common(top)]

    return {"samples": total, "top_own": shares(own), "top_inclusive": shares(inclusive)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "operator_profile.json")
    args = parser.parse_args()
    # The raw stacks (~1 MB) stay out of the results; the summary holds what they say.
    scratch = Path(tempfile.mkdtemp(prefix="kubetrain-profile-"))
    stacks, traced = scratch / "operator.stacks.txt", scratch / "tracemalloc.json"
    with measure.control_plane([ROOT / "crds"]) as cp:
        cpu_pass = measure_one(cp, SampledPeer(args.py_spy, stacks), args.jobs, args.nodes)
    with measure.control_plane([ROOT / "crds"]) as cp:
        memory_pass = measure_one(cp, TracedPeer(traced), args.jobs, args.nodes)
    result = {
        "jobs": args.jobs,
        "nodes_per_job": args.nodes,
        "cpu": {"run": cpu_pass, "profile": summarize_stacks(stacks), "raw_stacks": str(stacks)},
        "memory": {"run": memory_pass, "tracemalloc": json.loads(traced.read_text())},
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["cpu"]["profile"]["top_inclusive"][:15], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
