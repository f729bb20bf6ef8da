"""The real node of the tests (tests/support/node.py): start -> Node Ready -> CoreDNS answering,
a FROM-scratch pod's create -> Running, every process' resident memory with that pod running,
and teardown (including the host-state check). Each repeat is a fresh control plane and node.

    sudo .venv/bin/python benchmarks/real_node.py [--repeats 3] [--output FILE]

Needs root and `bash tests/cluster/install.sh`. Writes benchmarks/results/real_node.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import node as real  # noqa: E402
from support import nodepods  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "real_node.json"


def one_run(archive: Path) -> dict[str, Any]:
    with real.running_node() as node:
        node.load_images([archive])
        namespace = nodepods.restricted_namespace(node, "bench")
        pod_s = nodepods.run_pod(node, namespace, nodepods.scratch_pod("bench", ["hello", "1"]))
        rss = {name: round(mib, 1) for name, mib in node.rss_mib().items()}
        start = {name: round(s, 2) for name, s in node.timings.items() if name != "t0"}
    return {"start_s": start, "pod_create_to_running_s": round(pod_s, 2), "rss_mib": rss,
            "teardown_s": round(node.timings["teardown"], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = real.missing()
    if reason:
        sys.exit(f"no real node here: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        archive = nodepods.scratch_archive(Path(tmp))
        runs = []
        for repeat in range(args.repeats):
            runs.append(one_run(archive))
            print(f"repeat {repeat}: {runs[-1]}", flush=True)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    result = {
        "benchmark": "real node: start -> Ready -> DNS, scratch pod create -> Running, RSS, teardown",
        "repeats": args.repeats,
        "node_up_s": median([r["start_s"]["coredns answers"] for r in runs]),
        "pod_create_to_running_s": median([r["pod_create_to_running_s"] for r in runs]),
        "teardown_s": median([r["teardown_s"] for r in runs]),
        "rss_mib_total": median([sum(r["rss_mib"].values()) for r in runs]),
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))


if __name__ == "__main__":
    main()
